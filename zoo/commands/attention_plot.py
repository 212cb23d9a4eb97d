"""Drawing zoo.eval.attention_maps' heat maps: one PNG per attention kind, a grid of layers
(rows) x heads (columns), each panel query (rows) x key (columns) with the tokens on both axes.

Kept apart from the extraction so that reading weights out of a model never imports matplotlib,
and so the font handling (CJK sources need a fallback font) lives in one place.
"""

import functools
import io
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from zoo import paths
from zoo.errors import ConfigError

# Families that cover CJK and other scripts DejaVu Sans lacks (the synthetic translation task's
# sources are Chinese); whichever of them is installed becomes a fallback font of the labels.
_FALLBACK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans SC", "Source Han Sans SC",
                   "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Droid Sans Fallback",
                   "AR PL UMing CN", "SimHei", "Microsoft YaHei", "PingFang SC", "Arial Unicode MS")


def select(name: str, chosen: Sequence[int] | None, available: int) -> list[int]:
    """The layer (or head) indices to draw: all when `chosen` is None, else checked."""
    if chosen is None:
        return list(range(available))
    chosen = [int(i) for i in chosen]
    bad = [i for i in chosen if not 0 <= i < available]
    if not chosen or bad:
        raise ConfigError(f"{name}={chosen}: choose indices in [0, {available}) (the model has "
                          f"{available} {name})")
    return chosen


@functools.lru_cache(maxsize=1)
def _fallback_families() -> tuple[str, ...]:
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    return tuple(name for name in _FALLBACK_FONTS if name in installed)


def _uncovered(labels: Sequence[str], families: Sequence[str]) -> set[str]:
    """Label characters none of `families` can draw."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    covered: set[int] = set()
    for family in families:
        path = font_manager.findfont(font_manager.FontProperties(family=family),
                                     fallback_to_default=False)
        covered.update(FT2Font(path).get_charmap())
    return {c for label in labels for c in label if not c.isspace() and ord(c) not in covered}


def draw(maps: Any, path: str, *, layers: Sequence[int] | None = None,
         heads: Sequence[int] | None = None) -> str:
    """Draws one PNG: a grid of heat maps, a row per layer and a column per head.

    Each panel is query (rows, top to bottom) x key (columns); the token labels are on the left
    column's and the bottom row's axes, one colour scale (0 to the largest weight shown) and
    colorbar for all panels. The PNG's text chunks record the grid: 'Title', 'Layers' and
    'Heads' (the indices drawn, comma-separated) and 'Panels' (their count).

    Args:
      maps: what to draw (a zoo.eval.attention_maps.AttentionMaps: weights [L, H, q, k],
        the tokens, title, row_label / column_label, and per_head: whether to name layers and
        heads).
      path: the PNG to write, local or gs://... (its directory is created; the PNG is rendered
        in memory and written whole, one upload on GCS).
      layers, heads: indices to draw (default all).

    Returns:
      path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = select("layers", layers, maps.num_layers)
    heads = select("heads", heads, maps.num_heads)
    rows, cols = len(layers), len(heads)
    shown = maps.weights[np.ix_(layers, heads)]  # (rows, cols, q, k)
    vmax = max(float(shown.max()), 1e-6)
    q, k = len(maps.query_tokens), len(maps.key_tokens)
    # Big enough that every token label has its own line of text.
    size = float(np.clip(0.2 * max(q, k) + 0.6, 1.8, 8.0))
    families = ["DejaVu Sans", *_fallback_families()]
    missing = _uncovered(maps.query_tokens + maps.key_tokens, families)
    if missing:
        warnings.warn(
            f"draw: no installed font has {''.join(sorted(missing))!r}; those labels show as "
            "boxes (install a font covering them, e.g. Noto Sans CJK for Chinese)", stacklevel=2)
    with plt.rc_context({"font.family": families, "font.size": 8}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig, axes = plt.subplots(rows, cols, figsize=(cols * size + 1.5, rows * size + 1.0),
                                 squeeze=False, sharex=True, sharey=True, layout="constrained")
        image = None
        for r, layer in enumerate(layers):
            for c, head in enumerate(heads):
                ax = axes[r, c]
                image = ax.imshow(shown[r, c], cmap="viridis", vmin=0.0, vmax=vmax,
                                  aspect="auto", interpolation="nearest")
                ax.set_xticks(range(k), maps.key_tokens, rotation=90)
                ax.set_yticks(range(q), maps.query_tokens)
                ax.tick_params(length=0)
                ax.label_outer()
                if r == 0 and maps.per_head:
                    ax.set_title(f"head {head}")
                if c == 0:
                    where = f"layer {layer}\n" if maps.per_head else ""
                    ax.set_ylabel(where + maps.row_label, fontsize=9)
                if r == rows - 1:
                    ax.set_xlabel(maps.column_label)
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=min(1.0, 0.9 / rows + 0.1),
                     label="attention weight")
        fig.suptitle(maps.title)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100, metadata={
            "Title": maps.title,
            "Layers": ",".join(map(str, layers)),
            "Heads": ",".join(map(str, heads)),
            "Panels": str(rows * cols),
        })
        plt.close(fig)
    paths.write_atomic(path, png.getvalue())
    return path
