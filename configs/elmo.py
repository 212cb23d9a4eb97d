"""ELMo's biLM: forward and backward LSTM language models trained jointly on the synthetic
corpus (zoo/tasks/elmo.py); its layers are then features for classification
(configs/feature_classify.py).

    python train.py --config=configs/elmo.py:size=tiny --workdir=/tmp/elmo

Variants: size = tiny (H=32 per direction, 64-wide features; 800 steps, about a minute on a CPU)
| base (512 per direction, ELMo's layer width; a real corpus: config.data.source='tfds' or
'files').
"""

import ml_collections

from configs import common
from zoo.train.optim import default_optim_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_arg(arg, size="tiny")
    tiny = variant.size == "tiny"
    config = ml_collections.ConfigDict()
    config.task = "elmo"
    config.model = {
        "size": variant.size,
        "residual": True,  # residual connection between the LSTM layers, as ELMo's biLM
        "dropout_rate": 0.2 if tiny else 0.1,  # ELMo: 0.1; the tiny corpus (16k words) needs more
        "dtype": "float32" if tiny else "bfloat16",
        "param_dtype": "float32",
        # 'cpu_fused': zoo's LSTM kernel on a CPU (float32, ~1.6x the scan's speed); 'cudnn' on
        # a GPU (float32). Same parameters and results as 'scan'.
        "rnn_backend": "scan",
    }
    config.data = dict(
        common.source_config(),
        min_count=2 if tiny else 3,  # rarer words read as <unk>
        seq_len=48 if tiny else 128,  # tokens per row of packed sentences, <s> and </s> included
        batch_size=32 if tiny else 128,
        eval_batch_size=64 if tiny else 128,
    )
    steps = ml_collections.FieldReference(800 if tiny else 100_000)
    config.optim = default_optim_config()
    config.optim.update(learning_rate=1e-2 if tiny else 1e-3, warmup_steps=50 if tiny else 1000,
                        decay="cosine", b2=0.999, eps=1e-8, weight_decay=0.0, clip_norm=1.0)
    config.optim.total_steps = steps
    config.train = common.train_config(steps)
    config.train.update(eval_every=200 if tiny else 2000, best_metric="perplexity")
    config.mesh = common.mesh_config()
    return config
