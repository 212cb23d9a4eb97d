"""BERT pretraining (MLM + NSP).

    python train.py --config=configs/bert_pretrain.py:size=tiny --workdir=DIR   # offline demo
    python train.py --config=configs/bert_pretrain.py:size=base,phase=1 --workdir=P1 ...
    python train.py --config=configs/bert_pretrain.py:size=base,phase=2 --workdir=P2 \\
        --config.train.init_from=P1 ...

Variants: size = tiny | mini | small | medium | base | large; phase = 1 (sequence length 128,
20 predictions) | 2 (512, 80: started from the phase-1 params with --config.train.init_from);
optimizer = adamw (the BERT paper: batch 256, lr 1e-4, 1M steps split 90%/10%) | lamb (You et
al. 2019 as NVIDIA's recipe runs it: batch 64k then 32k, lr 6e-3 then 4e-3, 7,038 + 1,563
steps, warmup 28.43% then 12.8%). On a pod, prepare the data once, in parallel on every host,
into config.data.prepared_dir (`python -m zoo.commands.prepare --config=...`), then train from
it; without a prepared_dir the job prepares its own, keyed under config.data.cache_dir (by every
setting), so a rerun, a resume or the other phase never regenerates data it has already
prepared; point both phases at one cache_dir to share the tokenizer.

Real text: corpus = brown pretrains on the Brown corpus fetched into corpus_dir (default
'corpora', relative to where the job runs) by `python -m zoo.commands.corpus fetch brown --out
corpora`: source 'files', train.txt trains and validation.txt evaluates. More English text is
more globs, comma-separated: --config.data.train_files=corpora/brown/train.txt,\
corpora/shakespeare/train.txt,corpora/bible/train.txt (docs/tutorials/real-text.md).
"""

import ml_collections

from configs import common
from zoo.errors import ConfigError
from zoo.train.optim import default_optim_config

CORPORA = ("brown",)
# phase -> (seq_len, max_predictions_per_seq)
_PHASES = {1: (128, 20), 2: (512, 80)}
# (optimizer, phase) -> (global batch, peak lr, steps, warmup steps)
_RECIPES = {
    ("adamw", 1): (256, 1e-4, 900_000, 10_000),
    ("adamw", 2): (256, 1e-4, 100_000, 1_000),
    ("lamb", 1): (65_536, 6e-3, 7_038, 2_000),
    ("lamb", 2): (32_768, 4e-3, 1_563, 200),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_arg(arg, size="tiny", phase=1, optimizer="adamw", corpus="",
                               corpus_dir=common.CORPUS_DIR)
    if variant.corpus and variant.corpus not in CORPORA:
        raise common.unknown_corpus(variant.corpus, CORPORA)
    if variant.phase not in _PHASES:
        raise ConfigError(f"config variant phase={variant.phase} must be 1 or 2")
    if variant.optimizer not in ("adamw", "lamb"):
        raise ConfigError(f"config variant optimizer={variant.optimizer!r} must be adamw or lamb")
    tiny = variant.size == "tiny"
    seq_len, predictions = _PHASES[variant.phase]
    batch, lr, num_steps, warmup = _RECIPES[(variant.optimizer, variant.phase)]
    if tiny:  # the offline CPU demo on the synthetic corpus
        seq_len, predictions = (64, 10) if variant.phase == 1 else (128, 20)
        batch, lr, num_steps, warmup = 32, 2e-3, 3000, 60

    config = ml_collections.ConfigDict()
    config.task = "mlm_nsp"
    config.model = dict(
        size=variant.size, max_position_embeddings=128 if tiny else 512,
        dropout_rate=0.0 if tiny else 0.1, attention_dropout_rate=0.0 if tiny else 0.1,
        **common.runtime_model_config(tiny),
    )
    config.data = dict(
        common.source_config(),
        # 2,000 entities (~1,600 train documents): 500 is too few, tiny BERT overfits NSP
        synthetic_entities=2000,
        lowercase=True,  # WordPiece vocab.txt only: uncased BERT
        vocab_size=2048 if tiny else 30522,
        # A trained SentencePiece tokenizer sees a uniform sample of at most this many train
        # sentences, drawn with config.data.seed (the corpus never sits in memory whole).
        tokenizer_sample_sentences=10_000_000,
        cache_dir="",  # '' = <workdir>/data; share one between phases
        # Written by `python -m zoo.commands.prepare` (local or gs://); '' = prepare in the job.
        prepared_dir="",
        prepare_workers=0,  # worker processes per host for preparation; 0 = every core
        num_shards=1 if tiny else 64,  # synthetic / tfds sources: shards of the train split
        # files source: megabytes of text per shard; a worker holds one shard's examples (~70x
        # the text at seq 128 with 5 static passes: ~0.7 GB of memory per worker at 4)
        shard_mb=4.0,
        seq_len=seq_len,
        max_predictions_per_seq=predictions,
        masked_lm_prob=0.15,
        short_seq_prob=0.1,
        dupe_factor=5,  # passes over the corpus with new sentence pairs (and static masks)
        whole_word_masking=False,
        dynamic_masking=tiny,  # fresh masks every epoch, drawn from (seed, epoch, index)
        batch_size=batch,
        eval_batch_size=32 if tiny else 256,
        # Grain worker processes building train batches (0: threads in the training process);
        # the batches are the same for any count. A TPU VM host has cores to spare.
        num_workers=0,
        # Training reads runs of this many consecutive rows of a shard (rows were shuffled when
        # prepared), the runs shuffled each epoch: from a bucket, one ranged GET per run, so a
        # host of 1,024 rows per step sends ~65 small requests instead of 1,024. 1 = every row
        # drawn on its own; 0 = batch_size // 64 between 1 and 16, so every batch draws at
        # least 64 runs (tiny: 1; BERT's 256: 4; 1,024 and up: 16;
        # zoo.data.pipelines.pretraining.run_order).
        read_run_rows=0,
        # Records read ahead of training from a bucket, per host: the most they ever hold
        # (up to 16 batches, 2 x 16 held: phase 2's 512 rows per host per step are 0.7 MB);
        # 0 = read each batch when it is needed. A float, so fractions parse on the command line.
        read_ahead_mb=64.0,
    )
    steps = ml_collections.FieldReference(num_steps)
    config.optim = default_optim_config()
    config.optim.update(name=variant.optimizer, learning_rate=lr, warmup_steps=warmup,
                        decay="linear", b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                        clip_norm=1.0)
    config.optim.total_steps = steps
    config.train = common.train_config(steps)
    config.train.update(eval_every=200 if tiny else 10_000,
                        checkpoint_every=200 if tiny else 10_000, best_metric="mlm_loss",
                        log_every=50 if tiny else 100)
    config.mesh = common.mesh_config()
    if variant.corpus:
        config.data.update(common.corpus_data(variant.corpus, variant.corpus_dir,
                                              train_files="train.txt",
                                              eval_files="validation.txt"))
    return config
