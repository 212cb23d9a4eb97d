"""GPT-2 style LM. `--config=configs/gpt.py:size=tiny` trains on the synthetic corpus offline.

Variants: size = tiny | 124M | 355M | 774M; corpus = '' (synthetic) | shakespeare: nanoGPT's
character-level Shakespeare on CPU, on the corpus fetched into corpus_dir (default 'corpora',
relative to where the job runs) by `python -m zoo.commands.corpus fetch shakespeare --out
corpora` (docs/tutorials/real-text.md):

    python train.py --config=configs/gpt.py:corpus=shakespeare --workdir=/tmp/shakespeare_char

tokenizer = chars | gpt2 (with corpus=shakespeare): gpt2 reads the same split as GPT-2 tokens,
nanoGPT's data/shakespeare (GPT-2's byte-level BPE, 50,257 ids, fetched by `python -m
zoo.commands.corpus fetch gpt2_bpe --out corpora`), with the same model and recipe:

    python train.py --config=configs/gpt.py:corpus=shakespeare,tokenizer=gpt2 --workdir=/tmp/sh_bpe
"""

import os

import ml_collections

from configs import common
from zoo.errors import ConfigError
from zoo.train.optim import default_optim_config

CORPORA = ("shakespeare",)
TOKENIZERS = ("chars", "gpt2")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_arg(arg, size="tiny", corpus="", corpus_dir=common.CORPUS_DIR,
                               tokenizer="chars")
    if variant.corpus and variant.corpus not in CORPORA:
        raise common.unknown_corpus(variant.corpus, CORPORA)
    if variant.tokenizer not in TOKENIZERS or (variant.tokenizer != "chars"
                                               and not variant.corpus):
        raise ConfigError(f"config variant tokenizer={variant.tokenizer}: choose one of "
                          f"{', '.join(TOKENIZERS)}, with corpus=shakespeare (the synthetic "
                          "corpus trains its own SentencePiece model)")
    if variant.corpus and variant.size != "tiny":
        raise ConfigError(f"config variant corpus={variant.corpus} sets its own model shape "
                          f"(nanoGPT's 4 x 128); leave size at tiny, not {variant.size!r}")
    tiny = variant.size == "tiny"
    config = ml_collections.ConfigDict()
    config.task = "lm"

    config.model = dict(
        size=variant.size, dropout_rate=0.0 if tiny else 0.1,
        attention_dropout_rate=0.0 if tiny else 0.1, **common.runtime_model_config(tiny),
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
    if variant.corpus == "shakespeare":
        shakespeare_char(config, variant.corpus_dir)
        if variant.tokenizer == "gpt2":
            gpt2_tokens(config, variant.corpus_dir)
    return config


def shakespeare_char(config: ml_collections.ConfigDict, corpus_dir: str) -> None:
    """nanoGPT's config/train_shakespeare_char.py as its README runs it on a CPU: every
    character a token (the vocabulary: the training text's characters), the first 90% of
    shakespeare.txt trains and the last 10% validates; 4 layers, 4 heads, width 128, context
    64, batch 12, 2,000 steps, AdamW lr 1e-3 (100 warm-up steps, cosine to 1e-4), beta2 0.99,
    weight decay 0.1 (matrices and embeddings, not biases or LayerNorm), clip 1.0, dropout 0.
    Two differences from nanoGPT: rows are the text cut every 64 characters and shuffled each
    epoch (nanoGPT draws 12 random offsets per step), and the validation loss is the mean over
    the whole last 10% (nanoGPT: 200 random batches)."""
    config.model.update(num_layers=4, num_heads=4, embed_dim=128, mlp_dim=512,
                        dropout_rate=0.0, attention_dropout_rate=0.0)
    config.data.update(
        common.corpus_data("shakespeare", corpus_dir, train_files="shakespeare.txt"),
        char_split=0.9, tokenizer_type="chars", seq_len=64, batch_size=12,
        eval_batch_size=256)
    config.optim.update(learning_rate=1e-3, warmup_steps=100, decay="cosine",
                        end_learning_rate=1e-4, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1,
                        clip_norm=1.0)
    config.train.steps = 2000  # the FieldReference optim.total_steps follows
    config.train.update(eval_every=250, checkpoint_every=500, log_every=50)
    # 64 characters is all the model has seen: samples are one context long.
    config.sample.update(max_len=64, temperature=0.8, top_p=1.0, top_k=0)


def gpt2_tokens(config: ml_collections.ConfigDict, corpus_dir: str) -> None:
    """nanoGPT's data/shakespeare instead of shakespeare_char: the same 90% / 10% character
    split, each part encoded with GPT-2's byte-level BPE (the `gpt2_bpe` fetch: vocab.json and
    merges.txt; tiktoken's "gpt2" ids), a document starting and ending with <|endoftext|>.
    Model and recipe as shakespeare_char's; a context of 64 tokens is ~3.4x the characters."""
    config.data.update(corpus="shakespeare,gpt2_bpe",
                       tokenizer=os.path.join(corpus_dir, "gpt2_bpe"))
