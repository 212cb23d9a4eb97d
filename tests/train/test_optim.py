import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn.transformer import TransformerEncoder
from zoo.train import optim


def _cfg(**kw):
    cfg = optim.default_optim_config()
    cfg.update(kw)
    return cfg


@pytest.mark.parametrize(
    "decay, step, expected",
    [
        ("constant", 5, 0.5),  # warmup: linear 0 -> peak over 10 steps
        ("constant", 50, 1.0),
        ("linear", 55, 0.5),  # halfway from step 10 to 100
        ("cosine", 55, 0.5),  # cosine midpoint
        ("cosine", 100, 0.0),
        ("inverse_sqrt", 5, 0.5),  # step / warmup
        ("inverse_sqrt", 40, 0.5),  # sqrt(warmup / step) = sqrt(10/40)
    ],
)
def test_schedules_match_closed_forms(decay, step, expected):
    schedule = optim.make_schedule(_cfg(learning_rate=1.0, warmup_steps=10, total_steps=100,
                                        decay=decay))
    np.testing.assert_allclose(float(schedule(step)), expected, atol=1e-6)


def test_inverse_sqrt_is_the_transformer_paper_formula():
    d, warmup = 512, 4000
    cfg = _cfg(learning_rate=d**-0.5 * warmup**-0.5, warmup_steps=warmup, decay="inverse_sqrt")
    schedule = optim.make_schedule(cfg)
    for step in (1, 100, 4000, 10000, 100000):
        paper = d**-0.5 * min(step**-0.5, step * warmup**-1.5)
        np.testing.assert_allclose(float(schedule(step)), paper, rtol=1e-5)


def test_decay_mask_excludes_exactly_biases_and_layernorm():
    model = TransformerEncoder(num_layers=2, num_heads=2, mlp_dim=8, scan_layers=True)
    params = model.init(jax.random.key(0), jnp.ones((1, 3, 8)))["params"]
    mask = optim.decay_mask(params)
    flat = jax.tree_util.tree_leaves_with_path(mask)
    assert flat
    for path, decays in flat:
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        assert decays == (names[-1] not in ("bias", "scale")), names


def test_unknown_names_are_clear_errors():
    with pytest.raises(ValueError, match="config.optim.name"):
        optim.make_optimizer(_cfg(name="adamm"))
    with pytest.raises(ValueError, match="config.optim.decay"):
        optim.make_schedule(_cfg(decay="exp"))


@pytest.mark.parametrize("name", ["adamw", "lamb", "adafactor", "sgd"])
def test_every_optimizer_reduces_a_quadratic(name):
    opt = optim.make_optimizer(_cfg(name=name, learning_rate=0.1, warmup_steps=0,
                                    total_steps=100, decay="constant", weight_decay=0.0))
    params = {"w": jnp.array([[3.0, -2.0], [1.0, 4.0]])}
    state = opt.init(params)
    loss = lambda p: jnp.sum(p["w"] ** 2)  # noqa: E731
    start = loss(params)
    for _ in range(20):
        grads = jax.grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
    assert loss(params) < 0.5 * start


def test_frozen_subtree_never_moves_and_has_no_optimizer_state():
    params = {"bert": {"kernel": jnp.ones((3, 4))}, "classifier": {"kernel": jnp.ones((4, 2)),
                                                                   "bias": jnp.zeros(2)}}
    grads = jax.tree.map(lambda x: jnp.full_like(x, 100.0), params)
    opt = optim.make_optimizer(_cfg(learning_rate=0.1, warmup_steps=0, clip_norm=1.0),
                               frozen=("bert",))
    state = opt.init(params)
    updates, _ = opt.update(grads, state, params)
    np.testing.assert_array_equal(updates["bert"]["kernel"], 0.0)
    assert np.all(np.abs(np.asarray(updates["classifier"]["kernel"])) > 0)
    # Adam moments exist only for the trainable head.
    moment_sizes = sum(x.size for x in jax.tree.leaves(state) if x.ndim)
    head_size = 4 * 2 + 2
    assert moment_sizes == 2 * head_size, moment_sizes


def test_frozen_subtree_is_left_out_of_the_clipping_norm():
    params = {"bert": {"kernel": jnp.ones(4)}, "head": {"kernel": jnp.ones(1)}}
    # The head's gradient alone has norm 0.5 < clip_norm 1: unclipped, so SGD moves it by
    # exactly lr * 0.5. Counting bert's huge gradient would have scaled it down.
    grads = {"bert": {"kernel": jnp.full(4, 1e3)}, "head": {"kernel": jnp.full(1, 0.5)}}
    cfg = _cfg(name="sgd", learning_rate=1.0, warmup_steps=0, decay="constant", momentum=0.0,
               clip_norm=1.0)
    opt = optim.make_optimizer(cfg, frozen=("bert",))
    updates, _ = opt.update(grads, opt.init(params), params)
    np.testing.assert_allclose(updates["head"]["kernel"], [-0.5], rtol=1e-6)
