"""The Quickstart's main job: the user's story end to end on the embedded synthetic data.

    python train.py --config=configs/quickstart.py --workdir=runs/quickstart
    python eval.py  --config=configs/quickstart.py --workdir=runs/quickstart

Stage 1 pretrains tiny BERT (MLM + NSP) on the synthetic world's corpus; stage 2 fine-tunes it
on the synthetic SQuAD v1.1 set and reports EM/F1 on held-out questions. Each stage is a whole
job config (configs/bert_pretrain.py, configs/squad.py), overridable as usual, e.g.
--config.squad.train.steps=500; the stages share one data cache (the pretraining tokenizer) and
stage 2 starts from stage 1's params (zoo.commands.stages). The run ends by writing
<workdir>/curves.png (every stage's training curves) and <workdir>/summary.json. About
5 minutes on a 2-core CPU, offline (measured 4 min 45 s: F1 94.8); rerunning the command
resumes.
"""

import ml_collections

from configs import bert_pretrain, squad
from zoo.errors import ConfigError


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg:
        raise ConfigError(f"configs/quickstart.py takes no variant (got {arg!r}); override "
                          "stage keys instead, e.g. --config.squad.train.steps=500")
    config = ml_collections.ConfigDict()
    config.stages = ["pretrain", "squad"]
    config.pretrain = bert_pretrain.get_config("size=tiny")
    config.squad = squad.get_config("size=tiny,version=1.1")
    config.squad.train.eval_every = 250  # six points on the F1 curve
    return config
