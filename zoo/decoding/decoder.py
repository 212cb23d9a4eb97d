"""What every decoding loop (generate.py's greedy and sampling, beam.py's beam search) runs on: the
`Decoder` (a one-step model, its parameters and its per-sequence state), the `Decoded` result,
`from_linen` for a Linen model with a KV cache, and the host-side argument checks and loop start
the loops share. The package exports Decoder, Decoded and from_linen; the conventions (prompts,
padding, EOS) are its docstring.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

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


def concrete(x):
    """x as a numpy array, or None when it is traced (decoding called inside the caller's jit)."""
    try:
        return np.asarray(x)
    except jax.errors.TracerArrayConversionError:
        return None


def check_args(fn, decoder, prompts, prompt_lengths, max_len, eos_id, pad_id):
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
    values = concrete(prompt_lengths)
    if values is not None and (values.min() < 1 or values.max() > width):
        raise ValueError(
            f"{fn}: prompt_lengths must lie in [1, {width}] (every row needs at least a BOS), "
            f"got {values.tolist()}"
        )
    return prompts.astype(jnp.int32), lengths.astype(jnp.int32)


def check_float(fn, name, value, ok, what):
    known = concrete(value)
    if known is not None and (known.shape != () or not ok(float(known))):
        raise ConfigError(f"{fn}: {name}={value!r} must be {what}")
    return jnp.asarray(value, jnp.float32)


# ----------------------------------------------------------------------------------------------
# Loop pieces every search shares


def map_batched(fn, state, batch_axes):
    """Applies fn(leaf, axis) to every state leaf that has a batch axis."""
    leaves, treedef = jax.tree.flatten(state)
    return treedef.unflatten(
        [x if a is None else fn(x, a) for x, a in zip(leaves, batch_axes, strict=True)]
    )


def start_loop(decoder, prompts, lengths, max_len, pad_id):
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


def check_vocab(logits, eos_id, pad_id):
    vocab = logits.shape[-1]
    if eos_id >= vocab or pad_id >= vocab:
        raise ValueError(
            f"decoding: eos_id={eos_id} and pad_id={pad_id} must be ids of the model's "
            f"vocabulary of {vocab}"
        )


def kth_largest(x: jnp.ndarray, k: int) -> jnp.ndarray:
    """The k-th largest entry of each row of x [B, N], as [B, 1]: the least of lax.top_k's k
    values. Not top_k(...)[0][:, -1:]: XLA's CPU compiler keeps a top_k as its TopK call only
    when every use of the values starts at the first, and sorted each whole row otherwise
    (a beam search over 4 x 8,000 candidates a row spent 96% of its time in those sorts)."""
    return jnp.min(lax.top_k(x, k)[0], axis=1, keepdims=True)
