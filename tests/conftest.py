"""Every test runs on 8 fake CPU devices, so sharded paths are testable without accelerators."""

import os

# Must be set before jax is imported anywhere: the CPU backend reads it once at start-up.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import pytest  # noqa: E402  (after XLA_FLAGS, before anything imports jax)

from configs import gpt as gpt_config  # noqa: E402


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
