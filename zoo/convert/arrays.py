"""What every checkpoint converter needs: tensors as numpy, and key lists people can read."""

import re
from typing import Any

import jax.numpy as jnp
import numpy as np


def natural_key(name: str) -> list:
    """Sort key putting layer.2 before layer.10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def listing(names, limit: int = 20) -> str:
    """Names in natural order, comma-separated, cut after `limit` with a count of the rest."""
    names = sorted(names, key=natural_key)
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def to_numpy(value: Any) -> np.ndarray:
    """A numpy array of a torch.Tensor (without importing torch) or any array-like."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":  # numpy has no bfloat16: go through float32
            return value.float().numpy().astype(jnp.bfloat16)
        return value.numpy()
    return np.asarray(value)
