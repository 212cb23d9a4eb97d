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
        attention_dropout_rate=0.0 if tiny else 0.1, backend="einsum", scan_layers=not tiny,
        remat="none", dtype="float32" if tiny else "bfloat16", param_dtype="float32",
    )
    config.data = dict(
        common.source_config(),
        vocab_size=1024 if tiny else 32768,
        cache_dir="",  # trained tokenizer; '' = <workdir>/data
        seq_len=64 if tiny else 1024,
        batch_size=32 if tiny else 512,
        eval_batch_size=32 if tiny else 512,
    )
    steps = ml_collections.FieldReference(400 if tiny else 100_000)
    config.optim = default_optim_config()
    config.optim.update(learning_rate=3e-3 if tiny else 6e-4, warmup_steps=40 if tiny else 2000,
                        b2=0.99 if tiny else 0.95, eps=1e-8, weight_decay=0.1)
    config.optim.total_steps = steps
    config.train = common.train_config(steps)
    config.train.best_metric = "perplexity"
    # Text sampled from the trained model at the end of train.py and by eval.py (num=0: none).
    config.sample = dict(num=3, prompt="", max_len=48, temperature=0.8, top_k=0, top_p=0.95,
                         seed=0)
    config.mesh = common.mesh_config()
    return config
