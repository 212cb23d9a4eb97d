"""config.model.scan_unroll (zoo.train.layer_scan): 'auto' settled per platform, and an unrolled
layer scan computing what the one-layer loop computes over the same stacked parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import gpt as gpt_config
from zoo.commands import jobs
from zoo.errors import ConfigError
from zoo.models import gpt
from zoo.train import layer_scan


def _config(unroll):
    config = gpt_config.get_config("size=tiny")
    config.model.scan_layers = True
    config.model.scan_unroll = unroll
    return config


@pytest.mark.parametrize("platforms, settled", [(("cpu",), -1), (("tpu",), 1), (("gpu",), 1),
                                                (("cpu", "tpu"), 1)])
def test_auto_unrolls_on_cpus_only(platforms, settled):
    config = _config(0)
    assert layer_scan.resolve(config, platforms).model.scan_unroll == settled
    assert config.model.scan_unroll == 0  # the caller's config stays as given


def test_a_setting_is_kept_and_a_bad_one_named():
    assert layer_scan.resolve(_config(2), ("cpu",)).model.scan_unroll == 2
    with pytest.raises(ConfigError, match=r"config\.model\.scan_unroll=-3: use 0 \(auto\)"):
        layer_scan.resolve(_config(-3), ("cpu",))


def test_the_trainer_settles_auto_before_it_builds_the_model(tmp_path):
    setup = jobs.build(_config(0), str(tmp_path))  # this CPU
    assert setup.task.model_config.scan_unroll == -1


def _gpt(unroll):
    return gpt.GPT(gpt.GPTConfig(vocab_size=97, max_len=16, num_layers=3, num_heads=2,
                                 embed_dim=32, mlp_dim=64, dropout_rate=0.0,
                                 attention_dropout_rate=0.0, scan_layers=True,
                                 scan_unroll=unroll))


@pytest.mark.slow
def test_unrolled_layers_compute_the_loop_over_the_same_parameters():
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 97)
    params = _gpt(1).init(jax.random.key(0), tokens)["params"]

    def loss(unroll):
        return lambda p: jnp.mean(_gpt(unroll).apply({"params": p}, tokens) ** 2)

    programs = {u: jax.jit(jax.value_and_grad(loss(u))) for u in (1, -1)}
    (looped, looped_grads), (unrolled, unrolled_grads) = (programs[u](params) for u in (1, -1))
    np.testing.assert_allclose(unrolled, looped, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 unrolled_grads, looped_grads)
    # The loop is gone from the unrolled program (the stacked parameters stay).
    text = {u: programs[u].lower(params).as_text() for u in (1, -1)}
    assert "stablehlo.while" in text[1] and "stablehlo.while" not in text[-1]
