"""ELMo's biLM: forward and backward LSTM language models trained jointly on the synthetic
corpus (zoo/tasks/elmo.py); its layers are then features for classification
(configs/feature_classify.py).

    python train.py --config=configs/elmo.py:size=tiny --workdir=/tmp/elmo

Variants: size = tiny (H=32 per direction, 64-wide features; 800 steps, about a minute on a CPU)
| base (512 per direction, ELMo's layer width; a real corpus: config.data.source='tfds' or
'files'); corpus = '' (synthetic) | brown: the Brown corpus fetched into corpus_dir (default
'corpora', relative to where the job runs) by `python -m zoo.commands.corpus fetch brown --out
corpora`, train.txt trains and validation.txt evaluates; its features then classify
SpamAssassin's e-mails or Brown's genres (configs/feature_classify.py:corpus=...).
"""

import ml_collections

from configs import common
from zoo.train.optim import default_optim_config

CORPORA = ("brown",)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_arg(arg, size="tiny", corpus="", corpus_dir=common.CORPUS_DIR)
    if variant.corpus and variant.corpus not in CORPORA:
        raise common.unknown_corpus(variant.corpus, CORPORA)
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
    if variant.corpus == "brown":
        # tiny's 800 steps of 32 x 48 tokens read about one pass over Brown's 1.2M words.
        config.data.update(brown_data(variant.corpus_dir))
    return config


def brown_data(corpus_dir: str) -> dict:
    """The data keys of corpus=brown; configs/feature_classify.py repeats them as the
    pretraining run's (config.pretrained), so its vocabulary is rebuilt from the same text."""
    return common.corpus_data("brown", corpus_dir, train_files="train.txt",
                              eval_files="validation.txt")
