"""word2vec with negative sampling. `--config=configs/word2vec.py:size=tiny` trains on the
synthetic corpus offline in well under a minute on a CPU; query the vectors with
`python -m zoo.commands.word2vec_query --config=configs/word2vec.py:size=tiny --workdir=DIR ...`.

Variants: size = tiny | base (300-d vectors, the C tool's defaults for a real corpus such as a
TFDS one: config.data.source='tfds'); mode = skipgram | cbow; corpus = '' (synthetic) | english:
the English text of the corpora fetched into corpus_dir (default 'corpora', relative to where
the job runs) by `python -m zoo.commands.corpus fetch brown|shakespeare|bible --out corpora`
(Brown, Shakespeare's plays and the World English Bible: their train.txt trains, their
validation.txt validates) with gensim's and the C tool's defaults (english_recipe):

    python train.py --config=configs/word2vec.py:corpus=english --workdir=/tmp/w2v_english
    python train.py --config=configs/word2vec.py:corpus=english,mode=cbow --workdir=/tmp/w2v_cbow
"""

import ml_collections

from configs import common
from zoo.data.synthetic.world import NAMED_TYPES
from zoo.errors import ConfigError
from zoo.train.optim import default_optim_config

CORPORA = ("english",)
# corpus=english: every fetched corpus with English text (the bible's English side is its
# .txt files; its .tsv pairs it with the Spanish).
ENGLISH = ("brown", "shakespeare", "bible")
# Passes over the corpus (gensim's epochs=5, the C tool's -iter 5).
EPOCHS = 5
# The C tool's and gensim's SGD step per example: alpha = 0.025, decayed linearly to
# min_alpha = 0.0001 by the end of the run.
ALPHA, MIN_ALPHA = 0.025, 1e-4


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_arg(arg, size="tiny", mode="skipgram", corpus="",
                               corpus_dir=common.CORPUS_DIR)
    if variant.corpus and variant.corpus not in CORPORA:
        raise common.unknown_corpus(variant.corpus, CORPORA)
    if variant.corpus and variant.size != "tiny":
        raise ConfigError(f"config variant corpus={variant.corpus} sets its own vector width "
                          "(100); leave size at tiny")
    tiny = variant.size == "tiny"
    config = ml_collections.ConfigDict()
    config.task = "word2vec"

    config.model = dict(size=variant.size, mode=variant.mode, dtype="float32",
                        param_dtype="float32")
    config.data = dict(
        common.source_config(),
        min_count=2 if tiny else 5,  # rarer words are dropped (C tool: -min-count 5)
        window=5,  # the largest dynamic window (C tool: -window 5)
        # Subsampling threshold t (C tool: -sample 1e-3); 0 keeps every word.
        sample=1e-3,
        negatives=5,  # noise words per example (C tool: -negative 5)
        noise_power=0.75,  # noise P(w) ∝ count(w)^0.75
        pair_draws=4 if tiny else 1,  # passes of subsampling + windows drawn up front
        batch_size=1024 if tiny else 4096,
        eval_batch_size=1024 if tiny else 4096,
    )
    config.eval = dict(
        # Neighbour purity over the synthetic world's entity words (zoo/tasks/word2vec.py).
        purity_types=list(NAMED_TYPES),
        purity_k=5,
    )
    steps = ml_collections.FieldReference(300 if tiny else 200_000)
    config.optim = default_optim_config()
    # Adam without weight decay: decay would shrink every rare word's vector at every step,
    # though its gradient is almost always zero. Linear decay to 0 as the C tool's learning rate.
    config.optim.update(learning_rate=2e-2 if tiny else 2e-3, warmup_steps=0, decay="linear",
                        weight_decay=0.0, b2=0.999, eps=1e-8, clip_norm=0.0)
    config.optim.total_steps = steps
    config.train = common.train_config(steps)
    config.train.best_metric = "loss"
    # Nearest neighbours printed at the end of train.py and by eval.py ('' words: the first
    # entity word of each purity type; num_neighbours=0: none).
    config.sample = dict(words="", num_neighbours=8)
    config.mesh = common.mesh_config()
    if variant.corpus == "english":
        english_recipe(config, variant.corpus_dir)
    return config


def english_recipe(config: ml_collections.ConfigDict, corpus_dir: str) -> None:
    """gensim's Word2Vec defaults (the C tool's but for CBOW's alpha, 0.025 in both modes):
    100-d vectors, min_count 5, window 5, sample 1e-3, 5 noise words drawn from count^0.75,
    5 passes over the corpus, and its optimizer: plain SGD whose step per example is alpha =
    0.025, decayed linearly to 0.0001 over the run.

    Each pass is one draw of subsampling and dynamic windows (pair_draws = 5, as the C tool
    redraws them every pass), and the steps are one shuffled pass over the rows of all five:
    37.5M skip-gram pairs or 8.2M CBOW windows of the train splits (measured; 2.29M tokens,
    18,860 words seen 5 times). zoo's train step averages the gradient over the batch, so the
    learning rate is alpha x batch_size: every example's update is the reference's, applied
    together with the batch's others rather than one after another. The batch is small for
    that reason: a CBOW example's error reaches every word of its window (4.6 on average), so
    a frequent word's row takes many updates computed from the same parameters in one batch;
    at 4,096 CBOW trailed gensim by 0.026 in SimLex-999 Spearman, at 1,024 by 0.014, while
    skip-gram scored the same at both (benchmarks/quality_word2vec.py). Adam (the tiny
    recipe's) trails gensim here by 0.05-0.08 in SimLex-999: on a sparse table it moves every
    row seen by about the learning rate whatever its gradient's size, so a rare word's vector
    is as noisy as a frequent one's.
    """
    skipgram = config.model.mode == "skipgram"
    config.model.embed_dim = 100  # gensim's vector_size
    config.data.update(
        common.corpus_data(ENGLISH, corpus_dir, train_files="train.txt",
                           eval_files="validation.txt"),
        min_count=5, window=5, sample=1e-3, negatives=5, noise_power=0.75, pair_draws=EPOCHS,
        batch_size=1024, eval_batch_size=4096)
    batch = config.data.batch_size
    config.optim.update(name="sgd", momentum=0.0, learning_rate=ALPHA * batch,
                        end_learning_rate=MIN_ALPHA * batch, warmup_steps=0, decay="linear",
                        weight_decay=0.0, clip_norm=0.0)
    # One pass over the rows (optim.total_steps follows: the decay ends with it).
    config.train.steps = 36_590 if skipgram else 7_980
    config.train.update(log_every=500, eval_every=4000, checkpoint_every=4000)
    config.sample.words = "king,water,god,love,said,house"
