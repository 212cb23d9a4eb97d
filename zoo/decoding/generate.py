"""Greedy decoding and sampling (temperature, top-k, top-p), each one jit-compiled loop over a
zoo.decoding.Decoder; the conventions (prompts, padding, EOS) are the package's docstring."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zoo.data.tokenizers.base import EOS_ID, PAD_ID
from zoo.decoding.decoder import (Decoded, Decoder, check_args, check_float, check_vocab, concrete,
                                  kth_largest, start_loop)
from zoo.errors import ConfigError


def _filter_logits(logits, temperature, top_k, top_p, filter_top_p):
    """Temperature, then top-k, then nucleus filtering of logits [N, V]; removed ones -> -inf."""
    logits = logits / jnp.where(temperature > 0, temperature, 1.0)
    if 0 < top_k < logits.shape[-1]:
        # Ties with the k-th value survive too: k is a floor on the kept set, not a cap.
        kth = kth_largest(logits, top_k)  # (N, 1)
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if filter_top_p:
        # Keep the smallest top set whose probability reaches top_p: a token stays when the mass
        # strictly above it is < top_p, so the most likely token always stays.
        ranked = -jnp.sort(-logits, axis=-1)  # (N, V) descending
        probs = jax.nn.softmax(ranked, axis=-1)
        mass_above = jnp.cumsum(probs, axis=-1) - probs
        cutoff = jnp.min(jnp.where(mass_above < top_p, ranked, jnp.inf), -1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return logits


@functools.partial(
    jax.jit,
    static_argnames=("max_len", "eos_id", "pad_id", "greedy", "top_k", "filter_top_p"),
)
def _generate(decoder, prompts, lengths, rng, temperature, top_p, *, max_len, eos_id, pad_id,
              greedy, top_k, filter_top_p):
    tokens, lengths, state, start = start_loop(decoder, prompts, lengths, max_len, pad_id)
    batch = tokens.shape[0]

    def cond(carry):
        t, _, done, _, _, _ = carry
        return (t < max_len - 1) & ~jnp.all(done)

    def body(carry):
        t, tokens, done, scores, out_len, state = carry
        fed = lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)  # (B, 1)
        logits, state = decoder.step(decoder.params, fed, state)
        logits = logits.astype(jnp.float32)  # (B, V)
        check_vocab(logits, eos_id, pad_id)
        if greedy:
            choice = jnp.argmax(logits, axis=-1)
        else:
            filtered = _filter_logits(logits, temperature, top_k, top_p, filter_top_p)
            drawn = jax.random.categorical(jax.random.fold_in(rng, t), filtered, axis=-1)
            choice = jnp.where(temperature > 0, drawn, jnp.argmax(logits, axis=-1))
        choice = choice.astype(jnp.int32)
        forced = t + 1 < lengths  # (B,) still inside the prompt
        generating = ~forced & ~done
        prompt_next = lax.dynamic_index_in_dim(tokens, t + 1, axis=1, keepdims=False)
        nxt = jnp.where(forced, prompt_next, jnp.where(done, pad_id, choice))
        tokens = lax.dynamic_update_slice_in_dim(tokens, nxt[:, None], t + 1, axis=1)
        logp = jax.nn.log_softmax(logits, axis=-1)
        chosen_logp = jnp.take_along_axis(logp, choice[:, None], axis=-1)[:, 0]
        scores = scores + jnp.where(generating, chosen_logp, 0.0)
        out_len = jnp.where(generating, t + 2, out_len)
        done = done | (generating & (choice == eos_id))
        return t + 1, tokens, done, scores, out_len, state

    carry = (start, tokens, jnp.zeros((batch,), bool), jnp.zeros((batch,), jnp.float32),
             lengths, state)
    _, tokens, _, scores, out_len, _ = lax.while_loop(cond, body, carry)
    return Decoded(tokens, out_len, scores)


def greedy(
    decoder: Decoder,
    prompts: jax.Array,
    prompt_lengths: jax.Array | None = None,
    *,
    max_len: int,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
) -> Decoded:
    """Greedy decoding: the most likely next token at every step.

    Args:
      decoder: the model (see Decoder, from_linen) with a fresh state for B rows.
      prompts: int [B, P], right-padded; each prompt starts with at least a BOS.
      prompt_lengths: int [B] in [1, P], or None when every prompt fills all P columns.
      max_len: length of the output rows (prompt + continuation), > P and <= decoder.max_len.
      eos_id: the token that finishes a row; pad_id fills the row after it.

    Returns:
      Decoded with tokens [B, max_len], lengths [B], scores [B] (log-probabilities).
    """
    prompts, lengths = check_args("greedy", decoder, prompts, prompt_lengths, max_len, eos_id,
                                   pad_id)
    return _generate(decoder, prompts, lengths, jax.random.key(0), jnp.float32(0.0),
                     jnp.float32(1.0), max_len=int(max_len), eos_id=int(eos_id),
                     pad_id=int(pad_id), greedy=True, top_k=0, filter_top_p=False)


def sample(
    decoder: Decoder,
    prompts: jax.Array,
    prompt_lengths: jax.Array | None = None,
    *,
    rng: jax.Array,
    max_len: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
) -> Decoded:
    """Ancestral sampling from softmax(logits / temperature), optionally top-k / nucleus filtered.

    The filters combine in the usual order: temperature, then top-k (keep the k largest logits),
    then top-p (keep the smallest most-likely set whose renormalised probability reaches top_p);
    sampling is from the renormalised survivors. Step t draws with `fold_in(rng, t)`, so a fixed
    rng reproduces a run. temperature and top_p are traced: changing them does not recompile.

    Args:
      decoder, prompts, prompt_lengths, max_len, eos_id, pad_id: as in `greedy`.
      rng: a PRNG key.
      temperature: >= 0; 0 means greedy.
      top_k: keep the k most likely tokens (ties with the k-th kept too); 0 = no top-k.
      top_p: nucleus mass in (0, 1]; 1 = no nucleus filtering.

    Returns:
      Decoded with tokens [B, max_len], lengths [B], scores [B] (log-probabilities under the
      unscaled, unfiltered model).
    """
    prompts, lengths = check_args("sample", decoder, prompts, prompt_lengths, max_len, eos_id,
                                   pad_id)
    temperature = check_float("sample", "temperature", temperature,
                               lambda v: np.isfinite(v) and v >= 0, "a finite float >= 0")
    concrete_top_p = concrete(top_p)
    top_p = check_float("sample", "top_p", top_p, lambda v: 0 < v <= 1, "in (0, 1]")
    if not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ConfigError(f"sample: top_k={top_k!r} must be an int >= 0 (0 = no top-k filter)")
    filter_top_p = concrete_top_p is None or float(concrete_top_p) < 1.0
    return _generate(decoder, prompts, lengths, rng, temperature, top_p, max_len=int(max_len),
                     eos_id=int(eos_id), pad_id=int(pad_id), greedy=False, top_k=int(top_k),
                     filter_top_p=filter_top_p)
