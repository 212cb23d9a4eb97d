"""Attention scoring functions s(k, q) and key-value attention built on them.

The formulas of the course slides on sequence generation and attention: attention is two
steps, a distribution over the N inputs alpha_n = softmax_n s(k_n, q), then the expectation
sum_n alpha_n v_n. The scorer is the only part that varies:

  additive (Bahdanau)   s(k, q) = v^T tanh(W k + U q)
  mlp (perceptron)      s(k, q) = v^T act(W [k; q] + b)      (= additive for tanh, no b)
  dot                   s(k, q) = k^T q
  scaled dot            s(k, q) = k^T q / sqrt(d)
  bilinear (Luong)      s(k, q) = k^T W q

Every scorer maps queries q [b, m, dq] and keys k [b, n, dk] to scores [b, m, n] in float32 (the
scores feed a float32 softmax; matmuls accumulate in float32 even under a bf16 compute dtype).
"""

import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.nn.linear import Dense, default_kernel_init
from zoo.nn.masks import masked_softmax

Dtype = Any
Initializer = Any

_ACTIVATIONS: dict[str, Callable] = {
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
}


def _vector_init(key, shape, dtype=jnp.float32):
    # The output vector v of additive/MLP scoring: lecun-normal over its `hidden` inputs (flax's
    # lecun_normal needs a 2-D shape).
    return jax.random.normal(key, shape, dtype) * (shape[-1] ** -0.5)


def _check_qk(q, k, name: str, same_width: bool):
    if q.ndim != 3 or k.ndim != 3:
        raise ValueError(f"{name}: queries must be [b, m, dq] and keys [b, n, dk], got "
                         f"q {q.shape} and k {k.shape}")
    if same_width and q.shape[-1] != k.shape[-1]:
        raise ConfigError(
            f"{name}: queries and keys need the same width for a dot product, got dq="
            f"{q.shape[-1]} and dk={k.shape[-1]}; use 'bilinear', 'additive' or 'mlp' scoring "
            "for different widths"
        )


class AdditiveScore(nn.Module):
    """Bahdanau scoring s(k, q) = v^T tanh(W k + U q).

    Parameters: `key/kernel` W [dk, hidden], `query/kernel` U [dq, hidden], `v` [hidden].
    Materialises a [b, m, n, hidden] pre-activation: the price of a nonlinear scorer.
    """

    hidden: int
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init

    @nn.compact
    def __call__(self, q, k):
        _check_qk(q, k, "AdditiveScore", same_width=False)
        dense = functools.partial(Dense, self.hidden, ("embed", "mlp"), use_bias=False,
                                  dtype=self.dtype, param_dtype=self.param_dtype,
                                  kernel_init=self.kernel_init)
        wk = dense(name="key")(k)  # (b, n, hidden)
        uq = dense(name="query")(q)  # (b, m, hidden)
        v = self.param("v", nn.with_logical_partitioning(_vector_init, ("mlp",)), (self.hidden,),
                       self.param_dtype)
        h = jnp.tanh(uq[:, :, None, :] + wk[:, None, :, :])  # (b, m, n, hidden)
        return jnp.einsum("bmnh,h->bmn", h, v.astype(self.dtype),
                          preferred_element_type=jnp.float32)


class MLPScore(nn.Module):
    """One-hidden-layer perceptron on the concatenation: s(k, q) = v^T act(W [k; q] + b).

    The general form of the "multilayer perceptron attention" of the notes: a single kernel W
    [dk + dq, hidden] over [k; q], any activation, an optional hidden bias b. With
    `activation='tanh'` and `use_bias=False` it is exactly `AdditiveScore` with W_k = W[:dk] and
    W_q = W[dk:].

    Since W [k; q] = W[:dk] k + W[dk:] q, the two halves are projected separately and added with
    broadcasting: the same function without materialising the [b, m, n, dk + dq] concatenation.

    Attributes:
      hidden: hidden layer width h.
      activation: a callable, or one of 'tanh', 'relu', 'gelu', 'silu', 'sigmoid'.
      use_bias: add the hidden bias b.
    """

    hidden: int
    activation: str | Callable = "tanh"
    use_bias: bool = True
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init
    bias_init: Initializer = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, q, k):
        _check_qk(q, k, "MLPScore", same_width=False)
        act = self.activation
        if isinstance(act, str):
            if act not in _ACTIVATIONS:
                raise ConfigError(f"MLPScore: activation={act!r} is not one of "
                                  f"{sorted(_ACTIVATIONS)}; pass a callable for anything else")
            act = _ACTIVATIONS[act]
        dk = k.shape[-1]
        kernel = self.param(
            "kernel", nn.with_logical_partitioning(self.kernel_init, ("embed", "mlp")),
            (dk + q.shape[-1], self.hidden), self.param_dtype,
        ).astype(self.dtype)  # (dk + dq, hidden): rows [:dk] act on k, [dk:] on q
        wk = jnp.einsum("bnd,dh->bnh", k.astype(self.dtype), kernel[:dk])  # (b, n, hidden)
        wq = jnp.einsum("bmd,dh->bmh", q.astype(self.dtype), kernel[dk:])  # (b, m, hidden)
        pre = wq[:, :, None, :] + wk[:, None, :, :]  # (b, m, n, hidden)
        if self.use_bias:
            b = self.param("bias", nn.with_logical_partitioning(self.bias_init, ("mlp",)),
                           (self.hidden,), self.param_dtype)
            pre = pre + b.astype(self.dtype)
        v = self.param("v", nn.with_logical_partitioning(_vector_init, ("mlp",)), (self.hidden,),
                       self.param_dtype)
        return jnp.einsum("bmnh,h->bmn", act(pre), v.astype(self.dtype),
                          preferred_element_type=jnp.float32)


class DotScore(nn.Module):
    """Dot-product scoring s(k, q) = k^T q (no parameters; needs dq == dk)."""

    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, q, k):
        _check_qk(q, k, "DotScore", same_width=True)
        return jnp.einsum("bmd,bnd->bmn", q.astype(self.dtype), k.astype(self.dtype),
                          preferred_element_type=jnp.float32)


class ScaledDotScore(nn.Module):
    """Scaled dot-product scoring s(k, q) = k^T q / sqrt(d) (no parameters; needs dq == dk).

    The 1/sqrt(d) keeps the score variance ~1 for unit-variance inputs, so the softmax does not
    saturate as d grows.
    """

    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, q, k):
        _check_qk(q, k, "ScaledDotScore", same_width=True)
        s = jnp.einsum("bmd,bnd->bmn", q.astype(self.dtype), k.astype(self.dtype),
                       preferred_element_type=jnp.float32)
        return s / jnp.sqrt(jnp.float32(q.shape[-1]))


class BilinearScore(nn.Module):
    """Bilinear (Luong "general") scoring s(k, q) = k^T W q, any dq and dk.

    The parameter is stored as `query/kernel` [dq, dk] (= W^T, the projection of q into key
    space), so scoring is one projection then a dot product.
    """

    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init

    @nn.compact
    def __call__(self, q, k):
        _check_qk(q, k, "BilinearScore", same_width=False)
        wq = Dense(k.shape[-1], ("embed", "mlp"), use_bias=False, dtype=self.dtype,
                   param_dtype=self.param_dtype, kernel_init=self.kernel_init, name="query")(q)
        # (b, m, dk) . (b, n, dk) -> (b, m, n)
        return jnp.einsum("bmd,bnd->bmn", wq, k.astype(self.dtype),
                          preferred_element_type=jnp.float32)


SCORES: dict[str, type[nn.Module]] = {
    "additive": AdditiveScore,
    "dot": DotScore,
    "scaled_dot": ScaledDotScore,
    "bilinear": BilinearScore,
    "mlp": MLPScore,
}


def make_score(name: str, /, **kwargs) -> nn.Module:
    """Builds a scorer by name ('additive', 'dot', 'scaled_dot', 'bilinear', 'mlp').

    Args:
      name: registry key.
      **kwargs: the scorer's attributes, e.g. `hidden=32` for 'additive' and 'mlp'.
    """
    if name not in SCORES:
        raise ConfigError(f"score name {name!r} is unknown; valid names: {', '.join(SCORES)}")
    cls = SCORES[name]
    fields = set(cls.__dataclass_fields__) - {"parent"}
    unknown = set(kwargs) - fields
    if unknown:
        raise ConfigError(f"score {name!r} got unknown arguments {sorted(unknown)}; it accepts "
                          f"{sorted(fields - {'name'})}")
    return cls(**kwargs)


def scorer_for(score: str | nn.Module, score_kwargs: Mapping[str, Any] | None, dtype: Dtype,
               param_dtype: Dtype, owner: str) -> nn.Module:
    """The scorer an attention module uses: built by registry name (named 'score' under the
    calling module, with its `dtype`/`param_dtype` where the scorer takes them) or given."""
    if isinstance(score, str):
        cls = SCORES.get(score)
        extra = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype))
                 if cls is not None and k in cls.__dataclass_fields__}
        return make_score(score, **{**extra, **dict(score_kwargs or {})}, name="score")
    if score_kwargs:
        raise ValueError(f"{owner}: score_kwargs only applies when `score` is a name; configure "
                         "the scorer module directly instead")
    return score


def squeeze_head_mask(mask, owner: str):
    """A [b, 1, m, n] attention mask (zoo.nn.masks' layout, one head axis) as [b, m, n]."""
    if mask is not None and mask.ndim == 4:
        if mask.shape[1] != 1:
            raise ValueError(f"{owner}: a 4-D mask must be [b, 1, m, n] (no heads), got "
                             f"{mask.shape}")
        mask = mask[:, 0]
    return mask


class KeyValueAttention(nn.Module):
    """att((K, V), q) = sum_n softmax_n(s(k_n, q)) v_n for any scorer.

    Attributes:
      score: a registry name (see `make_score`) or a scorer module.
      score_kwargs: attributes for a scorer built by name (e.g. {'hidden': 32}); `dtype` and
        `param_dtype` are passed on automatically where the scorer takes them.
    """

    score: str | nn.Module = "scaled_dot"
    score_kwargs: Mapping[str, Any] | None = None
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, queries, keys, values=None, mask=None):
        """Attends queries [b, m, dq] over (keys [b, n, dk], values [b, n, dv]).

        Args:
          queries: [b, m, dq].
          keys: [b, n, dk].
          values: [b, n, dv]; None uses the keys as values (plain att(X, q)).
          mask: bool [b, m, n] or [b, 1, m, n] (True = attend), or anything broadcastable to
            [b, m, n]. A fully-masked query gets all-zero weights and a zero context.

        Returns:
          (context [b, m, dv] in `dtype`, weights [b, m, n] in float32).
        """
        values = keys if values is None else values
        scorer = scorer_for(self.score, self.score_kwargs, self.dtype, self.param_dtype,
                            "KeyValueAttention")
        scores = scorer(queries, keys)  # (b, m, n) float32
        weights = masked_softmax(scores, squeeze_head_mask(mask, "KeyValueAttention"))
        context = jnp.einsum("bmn,bnd->bmd", weights.astype(self.dtype), values.astype(self.dtype))
        return context, weights
