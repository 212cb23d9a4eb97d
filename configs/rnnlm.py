"""Recurrent language models (Elman RNN, LSTM, GRU; Zaremba et al. 2014). Trains on the synthetic
corpus offline, on the same tokens, rows and held-out split as `configs/gpt.py:size=tiny` and
`configs/nnlm.py:size=tiny`, so the perplexities compare:

    python train.py --config=configs/rnnlm.py:size=tiny --workdir=/tmp/rnnlm_tiny
    python train.py --config=configs/rnnlm.py:size=tiny,cell=gru --workdir=/tmp/rnnlm_gru
    python eval.py --config=configs/rnnlm.py:size=tiny --workdir=/tmp/rnnlm_tiny

Variants: size = tiny | base; cell = lstm | gru | rnn; corpus = '' (synthetic) | brown: word
level on the Brown corpus fetched into corpus_dir (default 'corpora', relative to where the job
runs) by `python -m zoo.commands.corpus fetch brown --out corpora`: train.txt trains,
validation.txt validates (test perplexity: eval.py with
--config.data.eval_files=corpora/brown/test.txt), a 10,000-word vocabulary (SentencePiece's
word model: the most frequent words, every other one the unknown id), 2,000 steps.
Width and depth are set on the command line, e.g. `--config.model.num_layers=3
--config.model.hidden_size=128 --config.model.tie_embeddings=False`.
"""

import ml_collections

from configs import common
from zoo.train.optim import default_optim_config

CORPORA = ("brown",)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_arg(arg, size="tiny", cell="lstm", corpus="",
                               corpus_dir=common.CORPUS_DIR)
    if variant.corpus and variant.corpus not in CORPORA:
        raise common.unknown_corpus(variant.corpus, CORPORA)
    tiny = variant.size == "tiny"
    config = ml_collections.ConfigDict()
    config.task = "rnnlm"

    config.model = dict(size=variant.size, cell=variant.cell, dropout_rate=0.0 if tiny else 0.5,
                        tie_embeddings=False, dtype="float32", param_dtype="float32")
    config.data = common.lm_data_config(tiny)
    steps = ml_collections.FieldReference(400 if tiny else 100_000)
    config.optim = default_optim_config()
    # Adam with gradient clipping: an RNN's gradients can explode through the recurrence
    # (Pascanu et al. 2013), so every update is clipped to a global norm of 1.
    config.optim.update(learning_rate=1e-2 if tiny else 1e-3, warmup_steps=40 if tiny else 2000,
                        b2=0.99 if tiny else 0.95, eps=1e-8, weight_decay=0.01, clip_norm=1.0)
    config.optim.total_steps = steps
    config.train = common.train_config(steps)
    config.train.best_metric = "perplexity"
    config.sample = common.lm_sample_config()
    config.mesh = common.mesh_config()
    if variant.corpus == "brown":
        # Brown is tokenised already (one space between tokens): words are its units.
        config.data.update(
            common.corpus_data("brown", variant.corpus_dir, train_files="train.txt",
                               eval_files="validation.txt"),
            tokenizer_type="word", vocab_size=10_000)
        if tiny:
            config.train.steps = 2000
            config.train.update(eval_every=500, checkpoint_every=500)
    return config
