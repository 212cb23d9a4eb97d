"""Tasks by name: each builds a model, its input pipeline, its loss and its eval metrics.

Imports are lazy so `train.py` pays only for the task it runs.
"""

import importlib

from zoo.errors import ConfigError
from zoo.tasks.base import Task

_REGISTRY = {
    "lm": "zoo.tasks.lm:LanguageModelTask",
    "mlm_nsp": "zoo.tasks.mlm_nsp:PretrainingTask",
    "squad": "zoo.tasks.squad:SquadTask",
    "classify": "zoo.tasks.classification:ClassificationTask",
    "translate": "zoo.tasks.translation:TranslationTask",
    "nnlm": "zoo.tasks.nnlm:NNLMTask",
    "word2vec": "zoo.tasks.word2vec:Word2VecTask",
    "rnnlm": "zoo.tasks.rnnlm:RNNLanguageModelTask",
    "rnn_translate": "zoo.tasks.rnn_translation:RNNTranslationTask",
    "elmo": "zoo.tasks.elmo:BiLMTask",
    "feature_classify": "zoo.tasks.feature_classification:FeatureClassificationTask",
    "gpt_classify": "zoo.tasks.gpt_classification:GPTClassificationTask",
}


def get(name: str) -> type[Task]:
    if name not in _REGISTRY:
        raise ConfigError(f"config.task: unknown task {name!r}; choose from {sorted(_REGISTRY)}")
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)
