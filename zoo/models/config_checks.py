"""Checks the frozen model configs share in their __post_init__."""

import jax.numpy as jnp

from zoo.errors import ConfigError


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
            raise ConfigError(f"{owner}.{name} must name a float dtype ('float32', "
                              f"'bfloat16'), got {value!r}")


# (names marking a table, what its rows count and the config keys that set them). The names
# are the reference checkpoints' (GPT-2's wte / wpe, BERT's word_ / position_embeddings), which
# every model family here with such a table uses.
_TABLE_HINTS = (
    (("['wte']", "['word_embeddings']"),
     ("its rows are the vocabulary: tokenize with the checkpoint's own tokenizer of {rows} "
      "tokens (set config.data.tokenizer to that run's .model / vocab.txt, kept in its "
      "config.data.cache_dir, by default <its workdir>/data)")),
    (("['wpe']",),
     ("its rows are the positions: set config.data.seq_len={rows} (a GPT job sizes its table "
      "from it)")),
    (("['position_embeddings']",),
     ("its rows are the positions: set config.model.max_position_embeddings={rows} and "
      "config.data.seq_len <= {rows}")),
)


def param_shape_hint(name: str, saved_shape: tuple[int, ...]) -> str:
    """Which config keys set parameter `name`'s shape (a jax keystr path such as
    "['wte']['embedding']"), for an error saying a checkpoint's `saved_shape` differs."""
    for markers, hint in _TABLE_HINTS:
        if any(marker in name for marker in markers) and saved_shape:
            return hint.format(rows=saved_shape[0])
    return "config.model.size (width, heads, depth) must be the checkpoint's"


def shape_mismatches(saved: dict[str, tuple[int, ...]],
                     wanted: dict[str, tuple[int, ...]]) -> list[str]:
    """'name: checkpoint (a, b), this model (c, d), <the config keys that set it>' for each
    parameter (jax keystr path) in both a checkpoint's `saved` shapes and this model's `wanted`
    ones whose shapes differ, in `wanted`'s order: the lines of every "a checkpoint does not fit
    this model" message (resume, init_from from a workdir, init_from from a HF directory)."""
    return [f"{name}: checkpoint {tuple(saved[name])}, this model {tuple(wanted[name])}, "
            f"{param_shape_hint(name, tuple(saved[name]))}"
            for name in wanted if name in saved and tuple(saved[name]) != tuple(wanted[name])]


def param_layout_hint(missing: list[str], saved: list[str]) -> str:
    """A hint when parameters are missing only because the layers are laid out differently:
    scanned stacks store one 'layers' subtree, unrolled ones 'layer_0', 'layer_1', ... ('' if
    the names do not show that)."""
    def has(names, marker):
        return any(marker in n for n in names)

    for ours, theirs, value in (("['layers']", "['layer_0']", False),
                                ("['layer_0']", "['layers']", True)):
        if has(missing, ours) and has(saved, theirs):
            return (f"; the checkpoint stores its layers {'stacked' if value else 'one by one'}:"
                    f" set config.model.scan_layers={value}")
    return ""


def check_length(owner: str, length: int, positions: int, field: str, config_key: str) -> None:
    """A clear error for an input longer than a learned position table: the model names its
    config `field` and the job's `config_key` (the embedding layer below knows neither)."""
    if length > positions:
        raise ConfigError(
            f"{owner}: the input has {length} tokens but the model has {positions} positions "
            f"({field}={positions}, set by {config_key}); cut the input to at most "
            f"{positions} tokens (lower config.data.seq_len) or use a model with more positions")
