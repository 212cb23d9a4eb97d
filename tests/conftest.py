"""Every test runs on 8 fake CPU devices, so sharded paths are testable without accelerators."""

import os

# Must be set before jax is imported anywhere: the CPU backend reads it once at start-up.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Imported only now: the environment above must be in place before anything loads jax.
import pytest

from configs import bert_pretrain
from configs import gpt as gpt_config

# Modules that train for minutes, longest first. `--dist loadscope` (pyproject addopts) keeps a
# module on one xdist worker, so its module-scoped training fixture runs once; starting these
# first lets the short modules fill the other worker around them instead of trailing behind.
_LONG_MODULES = (
    "tests/test_main_job.py",
    "tests/test_translation.py",
    "tests/test_elmo_binding.py",
    "tests/test_elmo.py",
    "tests/test_rnn_translation.py",
    "tests/test_bert_pretraining.py",
    "tests/test_gpt_finetune.py",
    "tests/benchmarks/test_step.py",
    "tests/train/test_multihost.py",
    "tests/test_classification_finetune.py",
    "tests/train/test_faults.py",
    "tests/train/test_checkpoint_restore.py",
    "tests/test_gpt_job.py",
    "tests/train/test_resume.py",
    "tests/test_squad_finetune.py",
    "tests/test_rnnlm_task.py",
    "tests/test_nnlm_task.py",
    "tests/test_word2vec.py",
    "tests/test_bad_inputs.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    rank = {path: i for i, path in enumerate(_LONG_MODULES)}
    # A stable sort: within a module, and among the short modules, collection order stays.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture
def tiny_lm_config():
    """The tiny GPT job shrunk to test size (the real config file, only smaller numbers)."""

    def make(**train):
        config = gpt_config.get_config("size=tiny")
        config.data.update(seq_len=16, batch_size=8, eval_batch_size=8, vocab_size=128)
        config.train.update(dict(dict(log_every=1, eval_every=1000, checkpoint_every=1000,
                                      tensorboard=False), **train))
        config.optim.warmup_steps = 2
        return config

    return make


@pytest.fixture(scope="session")
def tiny_pretrained_bert(tmp_path_factory):
    """A directory with a 4-step tiny BERT pretraining run (`pretrain`) and its data cache
    (`cache`: the tokenizer fine-tuning tests share): the start of every fine-tuning test."""
    from zoo.train import loop  # after XLA_FLAGS

    root = tmp_path_factory.mktemp("pretrained")
    config = bert_pretrain.get_config("size=tiny")
    config.data.update(synthetic_entities=100, vocab_size=512, seq_len=64,
                       cache_dir=str(root / "cache"), dupe_factor=1)
    config.train.update(steps=4, eval_every=4, log_every=2, tensorboard=False)
    loop.run(config, str(root / "pretrain"))
    return root

