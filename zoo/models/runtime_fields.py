"""How a Transformer-family model runs, apart from what it is: the fields BertConfig, GPTConfig
and TransformerConfig share and no checkpoint fixes (the attention kernel, the layer scan,
rematerialisation, the dtypes). Declared once here and inherited by the three configs; the
converters and fine-tuning tasks take RUN_CHOICES from the run's config.model rather than from a
checkpoint."""

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeFields:
    """backend: the attention kernel, one of zoo.nn.attention's ('einsum', 'blockwise',
    'dot_product', 'cudnn', 'pallas_gpu', 'splash'); attention_block: the query / key block of
    the blockwise and Pallas kernels; attention_window: 0 = full attention, w > 0 = a local
    window of w tokens (each model's docstring says on which sides); scan_layers: one layer
    compiled and scanned over the stack (params stacked on a leading axis) instead of unrolled;
    scan_unroll: layers per scan iteration (-1 all; 0 auto, which zoo.train.layer_scan settles
    per platform); remat: what the backward pass recomputes ('none', 'full', 'dots'); dtype,
    param_dtype: compute and parameter dtypes by name."""

    backend: str = "einsum"
    attention_block: int = 512
    attention_window: int = 0
    scan_layers: bool = False
    scan_unroll: int = 1
    remat: str = "none"
    dtype: str = "float32"
    param_dtype: str = "float32"


RUNTIME_FIELDS = tuple(field.name for field in dataclasses.fields(RuntimeFields))
# What a run chooses and a checkpoint leaves open: the runtime fields and the dropout rates
# (each model keeps its own dropout defaults, so they are not RuntimeFields).
RUN_CHOICES = ("dropout_rate", "attention_dropout_rate") + RUNTIME_FIELDS


def run_choices(model_config: Mapping[str, Any]) -> dict[str, Any]:
    """The RUN_CHOICES a run's config.model sets (as a mapping), to hand a converter's
    config_from_hf beside a checkpoint's own config."""
    return {key: model_config[key] for key in RUN_CHOICES if key in model_config}
