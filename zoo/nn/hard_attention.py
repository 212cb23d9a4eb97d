"""Hard attention (硬性注意力, as the course slides on sequence generation and attention call it):
select one input instead of averaging them all.

Soft attention returns the expectation att(X, q) = sum_n alpha_n x_n = E_{z ~ alpha}[x_z] with
alpha = softmax_n s(x_n, q). Hard attention returns a single x_z, the position z chosen

  * by argmax: z = argmax_n alpha_n (the mode), or
  * by sampling: z ~ Categorical(alpha) (the expectation's one-sample estimate).

The selection is a one-hot weight vector, so the context is exactly one value row. Its gradient
with respect to the scores is zero almost everywhere, so training needs an estimator:

  * 'straight_through' (Bengio et al. 2013): the forward pass uses the one-hot weights, the
    backward pass the gradient of the softmax alpha, through w = onehot + alpha - sg(alpha).
  * 'gumbel' (Jang et al. 2017, straight-through Gumbel-softmax): sample by the Gumbel-max trick,
    z = argmax_n (s_n + g_n) with g_n ~ Gumbel(0, 1), which draws z ~ Categorical(alpha) exactly;
    the backward pass uses y = softmax((s + g) / tau), through w = onehot + y - sg(y). A low tau
    makes y close to the one-hot but its gradient noisier.

Sampling needs the 'attention' rng stream; with `deterministic=True` (evaluation) every selection
becomes the argmax, as dropout turns off at evaluation.
"""

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.nn.masks import masked_softmax
from zoo.nn.scoring import scorer_for, squeeze_head_mask

Dtype = Any

SELECTIONS = ("argmax", "sample")
ESTIMATORS = ("straight_through", "gumbel")
RNG_STREAM = "attention"


def hard_weights(scores: jax.Array, mask: jax.Array | None = None, *, selection: str = "argmax",
                 estimator: str = "straight_through", temperature: float = 1.0,
                 rng: jax.Array | None = None) -> jax.Array:
    """One-hot attention weights over the last axis of `scores`, with a trainable gradient.

    Args:
      scores: float [..., n] scores s(x_n, q).
      mask: bool, broadcastable to `scores` (True = may be selected); a row with no True entry
        selects nothing (all-zero weights, as masked_softmax gives it).
      selection: 'argmax' or 'sample' (z ~ softmax(scores)); the 'gumbel' estimator always
        samples unless `rng` is None.
      estimator: 'straight_through' or 'gumbel' (see the module docstring).
      temperature: the Gumbel-softmax tau > 0 (gumbel only).
      rng: a PRNG key, needed to sample; None selects by argmax.

    Returns:
      float32 weights of the shape of `scores`: exactly one 1 per row (forward value), the
      estimator's surrogate gradient (backward).
    """
    if selection not in SELECTIONS:
        raise ValueError(f"hard attention: selection={selection!r} must be one of {SELECTIONS}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"hard attention: estimator={estimator!r} must be one of {ESTIMATORS}")
    if not temperature > 0:
        raise ValueError(f"hard attention: temperature={temperature!r} must be > 0")
    scores = jnp.asarray(scores, jnp.float32)
    keep = jnp.ones(scores.shape, bool) if mask is None else jnp.broadcast_to(mask, scores.shape)
    sample = rng is not None and (selection == "sample" or estimator == "gumbel")
    noise = jax.random.gumbel(rng, scores.shape) if sample else jnp.zeros_like(scores)
    # Gumbel-max: argmax(s + g) is a draw from softmax(s); masked positions can never win.
    perturbed = jnp.where(keep, scores + noise, -jnp.inf)
    chosen = jnp.argmax(perturbed, axis=-1)
    one_hot = jax.nn.one_hot(chosen, scores.shape[-1], dtype=jnp.float32)
    one_hot = jnp.where(keep.any(axis=-1, keepdims=True), one_hot, 0.0)
    if estimator == "gumbel":
        surrogate = masked_softmax((scores + noise) / temperature, keep)
    else:
        surrogate = masked_softmax(scores, keep)
    # Forward: exactly one_hot (the bracket is exactly 0 in value); backward: d surrogate.
    return one_hot + (surrogate - jax.lax.stop_gradient(surrogate))


class HardAttention(nn.Module):
    """att((K, V), q) = v_z for one selected position z, with any scorer of zoo.nn.scoring.

    Attributes:
      score: a registry name ('additive', 'dot', 'scaled_dot', 'bilinear', 'mlp') or a scorer.
      score_kwargs: attributes for a scorer built by name.
      selection: 'argmax' (the mode) or 'sample' (z ~ softmax of the scores) while training.
      estimator: 'straight_through' or 'gumbel'.
      temperature: Gumbel-softmax tau.
    """

    score: str | nn.Module = "scaled_dot"
    score_kwargs: Mapping[str, Any] | None = None
    selection: str = "sample"
    estimator: str = "straight_through"
    temperature: float = 1.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, queries, keys, values=None, mask=None, *, deterministic: bool = True):
        """Selects one of (keys [b, n, dk], values [b, n, dv]) for each query [b, m, dq].

        Args:
          mask: bool [b, m, n] or [b, 1, m, n] (True = may be selected).
          deterministic: select by argmax (evaluation); False samples when `selection` is
            'sample' or the estimator is 'gumbel', drawing from the 'attention' rng stream.

        Returns:
          (context [b, m, dv] in `dtype`: the selected value rows, weights [b, m, n] float32
          one-hot).
        """
        values = keys if values is None else values
        scorer = scorer_for(self.score, self.score_kwargs, self.dtype, self.param_dtype,
                            "HardAttention")
        scores = scorer(queries, keys)  # (b, m, n) float32
        samples = self.selection == "sample" or self.estimator == "gumbel"
        rng = None if deterministic or not samples else self.make_rng(RNG_STREAM)
        weights = hard_weights(scores, squeeze_head_mask(mask, "HardAttention"),
                               selection=self.selection, estimator=self.estimator,
                               temperature=self.temperature, rng=rng)
        # A one-hot row times the values is a gather of one row; the einsum keeps the gradient.
        context = jnp.einsum("bmn,bnd->bmd", weights.astype(self.dtype), values.astype(self.dtype))
        return context, weights
