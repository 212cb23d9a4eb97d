"""word2vec with negative sampling. `--config=configs/word2vec.py:size=tiny` trains on the
synthetic corpus offline in well under a minute on a CPU; query the vectors with
`python -m zoo.commands.word2vec_query --config=configs/word2vec.py:size=tiny --workdir=DIR ...`.

Variants: size = tiny | base (300-d vectors, the C tool's defaults for a real corpus such as a
TFDS one: config.data.source='tfds'); mode = skipgram | cbow.
"""

import ml_collections

from configs import common
from zoo.data.synthetic.world import NAMED_TYPES
from zoo.train.optim import default_optim_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_arg(arg, size="tiny", mode="skipgram")
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
    return config
