"""Losses kept as sums and denominators, so averages over devices, micro-batches and steps are
exact (a mean of means over unevenly padded batches would weight tokens unequally)."""

import jax
import jax.numpy as jnp


def cross_entropy_sums(
    logits: jnp.ndarray,
    targets: jnp.ndarray,
    weights: jnp.ndarray | None = None,
    label_smoothing: float = 0.0,
) -> dict[str, jnp.ndarray]:
    """Token-weighted softmax cross-entropy.

    Args:
      logits: [..., V] (any dtype; computed in float32).
      targets: [...] int ids.
      weights: [...] per-token weights (0 for padding); None = all ones.
      label_smoothing: eps; the target distribution is (1 - eps) one-hot + eps / V uniform.

    Returns:
      {'loss_sum', 'nll_sum', 'correct_sum', 'weight_sum'}: scalars; loss includes smoothing,
      nll is the plain negative log-likelihood (for perplexity).
    """
    logits = logits.astype(jnp.float32)
    if weights is None:
        weights = jnp.ones(targets.shape, jnp.float32)
    weights = weights.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    if label_smoothing:
        # Cross-entropy against the smoothed distribution; mean over V of -log p is the
        # uniform part.
        loss = (1.0 - label_smoothing) * nll - label_smoothing * log_probs.mean(axis=-1)
    else:
        loss = nll
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return {
        "loss_sum": jnp.sum(loss * weights),
        "nll_sum": jnp.sum(nll * weights),
        "correct_sum": jnp.sum(correct * weights),
        "weight_sum": jnp.sum(weights),
    }
