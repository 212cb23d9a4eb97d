"""Checks the frozen model configs share in their __post_init__."""

import jax.numpy as jnp


def check_float_dtypes(config, owner: str, names=("dtype", "param_dtype")) -> None:
    """Each of `config`'s fields `names` must name a floating dtype; the error names
    `owner.field` and what to write instead."""
    for name in names:
        value = getattr(config, name)
        try:
            ok = jnp.issubdtype(jnp.dtype(value), jnp.floating)
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"{owner}.{name} must name a float dtype ('float32', "
                             f"'bfloat16'), got {value!r}")
