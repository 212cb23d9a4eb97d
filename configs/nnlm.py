"""Bengio et al. (2003) NNLM. `--config=configs/nnlm.py:size=tiny` trains on the synthetic corpus
offline, on the same tokens, rows and held-out split as `configs/gpt.py:size=tiny`, so the two
perplexities compare.

Variants: size = tiny | base. The window (model.context = n - 1) and the direct connections
(model.direct) are set on the command line, e.g. `--config.model.context=7`.
"""

import ml_collections

from configs import common
from zoo.train.optim import default_optim_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_arg(arg, size="tiny")
    tiny = variant.size == "tiny"
    config = ml_collections.ConfigDict()
    config.task = "nnlm"

    config.model = dict(size=variant.size, context=4, direct=True,
                        dropout_rate=0.0 if tiny else 0.1, dtype="float32",
                        param_dtype="float32")
    config.data = common.lm_data_config(tiny)
    steps = ml_collections.FieldReference(400 if tiny else 100_000)
    config.optim = default_optim_config()
    config.optim.update(learning_rate=3e-3 if tiny else 1e-3, warmup_steps=40 if tiny else 2000,
                        b2=0.99 if tiny else 0.95, eps=1e-8, weight_decay=0.1)
    config.optim.total_steps = steps
    config.train = common.train_config(steps)
    config.train.best_metric = "perplexity"
    config.sample = common.lm_sample_config()
    config.mesh = common.mesh_config()
    return config
