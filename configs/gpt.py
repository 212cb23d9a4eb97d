"""GPT-2 style LM. `--config=configs/gpt.py:size=tiny` trains on the synthetic corpus offline.

Variants: size = tiny | 124M | 355M | 774M.
"""

import ml_collections

from configs import common
from zoo.train.optim import default_optim_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_arg(arg, size="tiny")
    tiny = variant.size == "tiny"
    config = ml_collections.ConfigDict()
    config.task = "lm"

    config.model = dict(
        size=variant.size, dropout_rate=0.0 if tiny else 0.1,
        attention_dropout_rate=0.0 if tiny else 0.1, backend="einsum", attention_block=512,
        attention_window=0, scan_layers=not tiny, remat="none",
        dtype="float32" if tiny else "bfloat16", param_dtype="float32",
    )
    config.data = common.lm_data_config(tiny)
    steps = ml_collections.FieldReference(400 if tiny else 100_000)
    config.optim = default_optim_config()
    config.optim.update(learning_rate=3e-3 if tiny else 6e-4, warmup_steps=40 if tiny else 2000,
                        b2=0.99 if tiny else 0.95, eps=1e-8, weight_decay=0.1)
    config.optim.total_steps = steps
    config.train = common.train_config(steps)
    config.train.best_metric = "perplexity"
    config.sample = common.lm_sample_config()
    config.mesh = common.mesh_config()
    return config
