"""Autoregressive decoding: greedy, sampling and beam search, each one jit-compiled loop.

The algorithms never see a model, only a `Decoder`: a one-step function
`step(params, tokens [N, L], state) -> (logits [N, V], state)` with its parameters (shared by every
sequence) and its per-sequence state (a KV cache, an RNN carry, encoder outputs), plus the batch
axis of each state leaf so beam search can tile and reorder the state. `from_linen` builds one for
a Linen model with a KV cache (GPT); an encoder-decoder or RNN decoder builds its own.

Prompts. A batch of prompts is right-padded, `prompts [B, P]` with `prompt_lengths [B]` (row b's
prompt is prompts[b, :prompt_lengths[b]]). Every row decodes from position 0 and shares one cache
index: at step t the loop feeds token t of each row and, while t + 1 < prompt_lengths[b], forces
the prompt's next token instead of choosing one. Rows with short prompts start generating earlier;
greedy and beam search give each row what decoding that row alone gives (sampling too, but for the
random numbers it draws). Prompt tokens cost one loop step each, except without `prompt_lengths`:
then every prompt fills all P columns and its first P - 1 tokens go through the model as one chunk
(prefill).

Outputs are `[B, max_len]` (beam search: `[B, K, max_len]`) token arrays holding the prompt, the
continuation and then `pad_id`: a row that emits `eos_id` is finished, everything after its EOS is
pad, and the loop stops as soon as every row is finished (or at max_len).
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zoo.data.tokenizers.base import EOS_ID, PAD_ID
from zoo.errors import ConfigError

StepFn = Callable[[Any, jax.Array, Any], tuple[jax.Array, Any]]


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class Decoder:
    """A one-step model, its parameters and its per-sequence state, ready for decoding.

    It is a pytree whose leaves are `params` and `state`; `step`, `batch_axes` and `max_len` are
    static, so the decoding loops compile once per (step, shapes, settings) and new parameter or
    state values reuse the compiled loop.

    Attributes:
      step: `step(params, tokens [N, L] int32, state) -> (logits [N, V], new state)`, the logits
        of the last of the L >= 1 new tokens. Hashable and comparable by value (a module-level
        function or a frozen dataclass): it keys the compilation cache.
      params: pytree shared by every sequence; never tiled or reordered.
      state: pytree of per-sequence arrays for N = B rows, fresh (decoding starts at position 0).
      batch_axes: for each leaf of `state` (in `jax.tree.leaves` order) its batch axis, or None
        for a leaf shared by all rows (a cache index).
      max_len: the longest sequence the state holds (the KV cache length); None = unbounded.
    """

    step: StepFn
    params: Any
    state: Any
    batch_axes: tuple[int | None, ...]
    max_len: int | None = None

    def tree_flatten(self):
        return (self.params, self.state), (self.step, self.batch_axes, self.max_len)

    @classmethod
    def tree_unflatten(cls, aux, children):
        step, batch_axes, max_len = aux
        params, state = children
        return cls(step, params, state, batch_axes, max_len)


class Decoded(NamedTuple):
    """Decoding results (beam search adds a beam axis K after the batch axis).

    Attributes:
      tokens: int32 [B, max_len] or [B, K, max_len]: prompt, continuation (EOS included), pad.
      lengths: int32 [B] or [B, K]: tokens before the padding (prompt + continuation).
      scores: float32 [B] or [B, K]. greedy/sample: the continuation's log-probability under the
        model's unscaled, unfiltered distribution. beam_search: that log-probability divided by
        (continuation length)^alpha; -inf marks an empty slot of the finished pool.
    """

    tokens: jax.Array
    lengths: jax.Array
    scores: jax.Array


# ----------------------------------------------------------------------------------------------
# Linen adapter


@dataclasses.dataclass(frozen=True)
class _LinenStep:
    """step() for a decode-mode Linen model: equal for equal modules, so jit reuses the loop."""

    model: nn.Module

    def __call__(self, params, tokens, cache):
        logits, mutated = self.model.apply(
            {"params": params, "cache": cache}, tokens, mutable=["cache"]
        )  # (N, L, V)
        return logits[:, -1].astype(jnp.float32), mutated["cache"]


def from_linen(model: nn.Module, params: Any, cache: Any) -> Decoder:
    """Wraps a Linen model in decode mode whose `apply(vars, tokens [B, L])` gives [B, L, V].

    The model must keep its autoregressive state in the 'cache' collection, created by
    `model.init(rng, jnp.zeros((B, max_len), jnp.int32))['cache']` (the KV caches of
    zoo.nn.attention and the position counter of zoo.nn.embeddings). Each leaf's batch axis and
    the cache length are found by comparing the cache shapes `model.init` gives for inputs of
    batch 1 vs 2 and length 1 vs 2 (shapes only, `jax.eval_shape`), so scanned layer stacks, whose
    cache leaves carry a leading 'layers' axis, work as well.

    Args:
      model: the module, built with decode=True.
      params: its parameters (boxed or not).
      cache: a fresh cache for batch B, as made by `model.init` above.

    Returns:
      A Decoder for batch B whose max_len is the cache length.
    """

    def cache_shapes(batch, length):
        variables = jax.eval_shape(
            lambda: model.init(jax.random.key(0), jnp.zeros((batch, length), jnp.int32))
        )
        if "cache" not in variables:
            raise ValueError(
                f"from_linen: {type(model).__name__}.init creates no 'cache' collection; build "
                "the model with decode=True"
            )
        return variables["cache"]

    base, wider, longer = cache_shapes(1, 1), cache_shapes(2, 1), cache_shapes(1, 2)
    leaves, treedef = jax.tree.flatten(nn.unbox(cache))
    probe_leaves, probe_def = jax.tree.flatten(nn.unbox(base))
    if treedef != probe_def:
        raise ValueError(
            f"from_linen: `cache` has structure {treedef}, but {type(model).__name__}.init makes "
            f"{probe_def}; pass model.init(rng, tokens)['cache'] of this very model"
        )
    batch_axes, batch_sizes, lengths = [], set(), []
    for leaf, b1, b2, l2 in zip(
        leaves, probe_leaves, jax.tree.leaves(nn.unbox(wider)), jax.tree.leaves(nn.unbox(longer))
    ):
        grows_b = [i for i, (u, v) in enumerate(zip(b1.shape, b2.shape)) if u != v]
        grows_l = [i for i, (u, v) in enumerate(zip(b1.shape, l2.shape)) if u != v]
        if len(grows_b) > 1 or len(grows_l) > 1 or np.ndim(leaf) != len(b1.shape):
            raise ValueError(
                f"from_linen: cannot locate the batch axis of a cache leaf of shape "
                f"{np.shape(leaf)}; build the Decoder yourself with explicit batch_axes"
            )
        axis = grows_b[0] if grows_b else None
        batch_axes.append(axis)
        if axis is not None:
            batch_sizes.add(np.shape(leaf)[axis])
        if grows_l:
            lengths.append(np.shape(leaf)[grows_l[0]])
    if len(batch_sizes) > 1:
        raise ValueError(f"from_linen: cache leaves disagree on the batch size: {batch_sizes}")
    return Decoder(
        step=_LinenStep(model),
        params=params,
        state=cache,
        batch_axes=tuple(batch_axes),
        max_len=min(lengths) if lengths else None,
    )


# ----------------------------------------------------------------------------------------------
# Argument checks (host side; values that are tracers are left to the caller)


def _concrete(x):
    """x as a numpy array, or None when it is traced (decoding called inside the caller's jit)."""
    try:
        return np.asarray(x)
    except jax.errors.TracerArrayConversionError:
        return None


def _check_args(fn, decoder, prompts, prompt_lengths, max_len, eos_id, pad_id):
    if not isinstance(decoder, Decoder):
        raise TypeError(f"{fn}: decoder must be a Decoder (see from_linen), got {type(decoder)}")
    prompts = jnp.asarray(prompts)
    if prompts.ndim != 2 or not jnp.issubdtype(prompts.dtype, jnp.integer):
        raise ValueError(
            f"{fn}: prompts must be an integer array [batch, width], got {prompts.dtype} "
            f"{prompts.shape}"
        )
    batch, width = prompts.shape
    if width < 1:
        raise ValueError(f"{fn}: prompts must hold at least one token (a BOS) per row")
    if not isinstance(max_len, (int, np.integer)) or max_len <= width:
        raise ValueError(
            f"{fn}: max_len={max_len!r} must be an int > the prompt width {width} (max_len counts "
            "the prompt and the continuation)"
        )
    if decoder.max_len is not None and max_len > decoder.max_len:
        raise ValueError(
            f"{fn}: max_len={max_len} exceeds the decoder's cache length {decoder.max_len}; "
            f"lower max_len or build the cache with model.init on [batch, {max_len}] tokens"
        )
    for name, value in (("eos_id", eos_id), ("pad_id", pad_id)):
        if not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{fn}: {name}={value!r} must be a non-negative int token id")
    leaves = jax.tree.leaves(decoder.state)
    if len(decoder.batch_axes) != len(leaves):
        raise ValueError(
            f"{fn}: decoder.batch_axes has {len(decoder.batch_axes)} entries for "
            f"{len(leaves)} state leaves; give one (an axis or None) per leaf"
        )
    for leaf, axis in zip(leaves, decoder.batch_axes):
        if axis is not None and np.shape(leaf)[axis] != batch:
            raise ValueError(
                f"{fn}: prompts have batch {batch} but a decoder state leaf {np.shape(leaf)} has "
                f"{np.shape(leaf)[axis]} rows on its batch axis {axis}; build the state (cache) "
                "for the prompts' batch size"
            )
    if prompt_lengths is None:
        return prompts.astype(jnp.int32), None
    lengths = jnp.asarray(prompt_lengths)
    if lengths.shape != (batch,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(
            f"{fn}: prompt_lengths must be integers [batch] = [{batch}], got {lengths.dtype} "
            f"{lengths.shape}"
        )
    values = _concrete(prompt_lengths)
    if values is not None and (values.min() < 1 or values.max() > width):
        raise ValueError(
            f"{fn}: prompt_lengths must lie in [1, {width}] (every row needs at least a BOS), "
            f"got {values.tolist()}"
        )
    return prompts.astype(jnp.int32), lengths.astype(jnp.int32)


def _check_float(fn, name, value, ok, what):
    concrete = _concrete(value)
    if concrete is not None and (concrete.shape != () or not ok(float(concrete))):
        raise ConfigError(f"{fn}: {name}={value!r} must be {what}")
    return jnp.asarray(value, jnp.float32)


# ----------------------------------------------------------------------------------------------
# Shared loop pieces


def _map_batched(fn, state, batch_axes):
    """Applies fn(leaf, axis) to every state leaf that has a batch axis."""
    leaves, treedef = jax.tree.flatten(state)
    return treedef.unflatten(
        [x if a is None else fn(x, a) for x, a in zip(leaves, batch_axes, strict=True)]
    )


def _start(decoder, prompts, lengths, max_len, pad_id):
    """Token buffer [B, max_len], prompt lengths [B], state and first position of the loop."""
    batch, width = prompts.shape
    prefill = lengths is None
    if prefill:
        lengths = jnp.full((batch,), width, jnp.int32)
    in_prompt = jnp.arange(width)[None, :] < lengths[:, None]  # (B, P)
    tokens = jnp.full((batch, max_len), pad_id, jnp.int32)
    tokens = tokens.at[:, :width].set(jnp.where(in_prompt, prompts, pad_id))
    state, start = decoder.state, 0
    if prefill and width > 1:
        # Equal-length prompts: run all but the last prompt token as one chunk; the loop feeds
        # the last one and gets the first continuation's logits.
        _, state = decoder.step(decoder.params, tokens[:, : width - 1], state)
        start = width - 1
    return tokens, lengths, state, jnp.int32(start)


def _check_vocab(logits, eos_id, pad_id):
    vocab = logits.shape[-1]
    if eos_id >= vocab or pad_id >= vocab:
        raise ValueError(
            f"decoding: eos_id={eos_id} and pad_id={pad_id} must be ids of the model's "
            f"vocabulary of {vocab}"
        )


# ----------------------------------------------------------------------------------------------
# Greedy and sampling


def _filter_logits(logits, temperature, top_k, top_p, filter_top_p):
    """Temperature, then top-k, then nucleus filtering of logits [N, V]; removed ones -> -inf."""
    logits = logits / jnp.where(temperature > 0, temperature, 1.0)
    if 0 < top_k < logits.shape[-1]:
        # Ties with the k-th value survive too: k is a floor on the kept set, not a cap.
        kth = lax.top_k(logits, top_k)[0][:, -1:]  # (N, 1)
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
    tokens, lengths, state, start = _start(decoder, prompts, lengths, max_len, pad_id)
    batch = tokens.shape[0]

    def cond(carry):
        t, _, done, _, _, _ = carry
        return (t < max_len - 1) & ~jnp.all(done)

    def body(carry):
        t, tokens, done, scores, out_len, state = carry
        fed = lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)  # (B, 1)
        logits, state = decoder.step(decoder.params, fed, state)
        logits = logits.astype(jnp.float32)  # (B, V)
        _check_vocab(logits, eos_id, pad_id)
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
    prompts, lengths = _check_args("greedy", decoder, prompts, prompt_lengths, max_len, eos_id,
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
    prompts, lengths = _check_args("sample", decoder, prompts, prompt_lengths, max_len, eos_id,
                                   pad_id)
    temperature = _check_float("sample", "temperature", temperature,
                               lambda v: np.isfinite(v) and v >= 0, "a finite float >= 0")
    concrete_top_p = _concrete(top_p)
    top_p = _check_float("sample", "top_p", top_p, lambda v: 0 < v <= 1, "in (0, 1]")
    if not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ConfigError(f"sample: top_k={top_k!r} must be an int >= 0 (0 = no top-k filter)")
    filter_top_p = concrete_top_p is None or float(concrete_top_p) < 1.0
    return _generate(decoder, prompts, lengths, rng, temperature, top_p, max_len=int(max_len),
                     eos_id=int(eos_id), pad_id=int(pad_id), greedy=False, top_k=int(top_k),
                     filter_top_p=filter_top_p)


# ----------------------------------------------------------------------------------------------
# Beam search


@functools.partial(jax.jit, static_argnames=("max_len", "beam_size", "eos_id", "pad_id"))
def _beam_search(decoder, prompts, lengths, alpha, *, max_len, beam_size, eos_id, pad_id):
    k = beam_size
    tokens, lengths, state, start = _start(decoder, prompts, lengths, max_len, pad_id)
    batch = tokens.shape[0]
    # Beam j of row b is row b * K + j of the tiled state.
    state = _map_batched(lambda x, a: jnp.repeat(x, k, axis=a), state, decoder.batch_axes)
    live_seqs = jnp.repeat(tokens[:, None], k, axis=1)  # (B, K, T)
    # One live beam per row at first: the others are -inf so the first expansion does not pick
    # K copies of the same continuation.
    live_logp = jnp.broadcast_to(jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf), (batch, k))
    # Empty pool slots: all pad, length 0, score -inf.
    fin_seqs = jnp.full_like(live_seqs, pad_id)
    fin_scores = jnp.full((batch, k), -jnp.inf)
    fin_len = jnp.zeros((batch, k), jnp.int32)
    max_gen = (max_len - lengths).astype(jnp.float32)  # the longest continuation, EOS incl. (B,)

    def cond(carry):
        t, done = carry[0], carry[6]
        return (t < max_len - 1) & ~jnp.all(done)

    def body(carry):
        t, live_seqs, live_logp, fin_seqs, fin_scores, fin_len, done, state = carry
        fed = lax.dynamic_slice_in_dim(live_seqs, t, 1, axis=2).reshape(batch * k, 1)
        logits, state = decoder.step(decoder.params, fed, state)  # (B*K, V)
        _check_vocab(logits, eos_id, pad_id)
        vocab = logits.shape[-1]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1).reshape(batch, k, vocab)
        ids = jnp.arange(vocab)
        forced = t + 1 < lengths  # (B,)
        prompt_next = lax.dynamic_index_in_dim(live_seqs[:, 0], t + 1, axis=1, keepdims=False)
        # Inside the prompt the only continuation is the prompt's token, at no cost.
        forced_logp = jnp.where(ids == prompt_next[:, None, None], 0.0, -jnp.inf)  # (B, 1, V)
        cand = live_logp[:, :, None] + jnp.where(forced[:, None, None], forced_logp, logp)

        # Finished candidates: a beam + EOS, admitted to the pool only if it ranks among this
        # step's K best candidates (the classic beam: it would have been kept). With K = 1 this
        # is exactly greedy's stopping rule.
        kth = lax.top_k(cand.reshape(batch, k * vocab), k)[0][:, -1:]  # (B, 1)
        eos_logp = cand[:, :, eos_id]  # (B, K)
        admit = (~forced & ~done)[:, None] & (eos_logp >= kth) & (eos_logp > -jnp.inf)
        gen_len = (t + 2 - lengths).astype(jnp.float32)  # continuation length incl. EOS (B,)
        eos_scores = jnp.where(admit, eos_logp / gen_len[:, None] ** alpha, -jnp.inf)
        eos_seqs = lax.dynamic_update_slice_in_dim(
            live_seqs, jnp.full((batch, k, 1), eos_id, jnp.int32), t + 1, axis=2)
        pool_scores = jnp.concatenate([fin_scores, eos_scores], axis=1)  # (B, 2K)
        pool_seqs = jnp.concatenate([fin_seqs, eos_seqs], axis=1)  # (B, 2K, T)
        pool_len = jnp.concatenate([fin_len, jnp.full((batch, k), t + 2, jnp.int32)], axis=1)
        fin_scores, best = lax.top_k(pool_scores, k)  # (B, K), sorted
        fin_seqs = jnp.take_along_axis(pool_seqs, best[:, :, None], axis=1)
        fin_len = jnp.take_along_axis(pool_len, best, axis=1)

        # Live beams: the K best continuations that do not end in EOS (in the prompt the forced
        # token continues even if it is EOS).
        is_eos = (ids == eos_id)[None, None, :] & ~forced[:, None, None]
        new_logp, flat = lax.top_k(jnp.where(is_eos, -jnp.inf, cand).reshape(batch, k * vocab), k)
        parent, token = flat // vocab, (flat % vocab).astype(jnp.int32)  # (B, K)
        new_seqs = jnp.take_along_axis(live_seqs, parent[:, :, None], axis=1)
        new_seqs = lax.dynamic_update_slice_in_dim(new_seqs, token[:, :, None], t + 1, axis=2)
        rows = (jnp.arange(batch)[:, None] * k + parent).reshape(-1)  # (B*K,) into the tiled state
        state = _map_batched(lambda x, a: jnp.take(x, rows, axis=a), state, decoder.batch_axes)
        live_seqs, live_logp = new_seqs, new_logp

        # A row is finished once its pool holds K hypotheses none of which a live beam can
        # still beat, or no live beam is left. A live beam's log P only falls, so its best
        # normalised score to come is log P / L_max^alpha (L_max: the longest continuation
        # max_len allows; log P < 0), as T5X bounds it; with alpha = 0 that is log P itself.
        # Stopping as soon as the pool is full (fairseq's rule) let a small-vocabulary model
        # fill it with improbable early EOS hypotheses from the weaker beams one step before
        # the best beam ended: the tiny translator scored 'forty plus forty equals ninety'
        # (log P -5.26) over greedy's 'eighty' (-0.61), 3 points of exact match below greedy.
        best_to_come = live_logp[:, 0] / max_gen**alpha  # (B,)
        full = fin_scores[:, -1] > -jnp.inf
        beaten = fin_scores[:, -1] >= best_to_come
        done = done | (full & beaten) | jnp.all(live_logp == -jnp.inf, axis=1)
        return t + 1, live_seqs, live_logp, fin_seqs, fin_scores, fin_len, done, state

    carry = (start, live_seqs, live_logp, fin_seqs, fin_scores, fin_len,
             jnp.zeros((batch,), bool), state)
    t, live_seqs, live_logp, fin_seqs, fin_scores, fin_len, _, _ = lax.while_loop(
        cond, body, carry)
    # Rows that finished nothing return their live beams (already sorted: equal lengths).
    live_gen = jnp.maximum(t + 1 - lengths, 1).astype(jnp.float32)  # (B,)
    live_scores = live_logp / live_gen[:, None] ** alpha
    any_fin = fin_scores[:, :1] > -jnp.inf  # (B, 1)
    scores = jnp.where(any_fin, fin_scores, live_scores)
    tokens = jnp.where(any_fin[:, :, None], fin_seqs, live_seqs)
    lengths = jnp.where(any_fin, fin_len, t + 1)
    # Slots without a hypothesis (a pool not filled, fewer live beams than K) read as empty.
    empty = scores == -jnp.inf
    return Decoded(jnp.where(empty[:, :, None], pad_id, tokens), jnp.where(empty, 0, lengths),
                   scores)


def beam_search(
    decoder: Decoder,
    prompts: jax.Array,
    prompt_lengths: jax.Array | None = None,
    *,
    beam_size: int,
    max_len: int,
    alpha: float = 0.75,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
) -> Decoded:
    """Beam search with length normalisation log P(y) / L^alpha (seed 002, alpha = 0.75).

    Each step expands the K live beams by every token (K * V candidates). A candidate ending in
    EOS that ranks among the step's K best moves to the row's pool of finished hypotheses (the K
    best by normalised score); the live beams continue as the K best candidates not ending in
    EOS, and the state is reordered to match by a gather along its batch axis. A row stops once
    its pool is full and no live beam can still outscore the pool's worst: a live beam's best
    score to come is log P / L_max^alpha, L_max the longest continuation max_len allows (T5X's
    bound; not fairseq's rule of stopping once the pool is full, which returns improbable early
    hypotheses when the weaker beams end first). With alpha = 0 and beam_size 1 this is greedy
    decoding. The result is the pool, or the live beams for a row that finished no hypothesis
    by max_len. L counts the
    generated tokens including the EOS; the prompt scores nothing.

    Args:
      decoder, prompts, prompt_lengths, max_len, eos_id, pad_id: as in `greedy` (the state is
        for B rows; it is tiled to B * beam_size here).
      beam_size: K >= 1.
      alpha: length-normalisation exponent >= 0; 0 ranks by raw log-probability.

    Returns:
      Decoded with tokens [B, K, max_len], lengths [B, K] and normalised scores [B, K], best
      first; empty slots (fewer than K hypotheses) hold only pad, length 0 and score -inf.
    """
    prompts, lengths = _check_args("beam_search", decoder, prompts, prompt_lengths, max_len,
                                   eos_id, pad_id)
    if not isinstance(beam_size, (int, np.integer)) or beam_size < 1:
        raise ConfigError(f"beam_search: beam_size={beam_size!r} must be an int >= 1")
    alpha = _check_float("beam_search", "alpha", alpha, lambda v: np.isfinite(v) and v >= 0,
                         "a finite float >= 0 (0 = no length normalisation)")
    return _beam_search(decoder, prompts, lengths, alpha, max_len=int(max_len),
                        beam_size=int(beam_size), eos_id=int(eos_id), pad_id=int(pad_id))
