import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.numerics import assert_close
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
    assert any(not d for _, d in flat) and any(d for _, d in flat)


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
    assert_close(updates["head"]["kernel"], np.array([-0.5]), 1e-6)


def _one_update(cfg, params, grads):
    opt = optim.make_optimizer(cfg)
    updates, _ = opt.update(grads, opt.init(params), params)
    return jax.tree.map(np.asarray, updates)


def test_clipping_rescales_the_gradient_to_clip_norm():
    # SGD with lr 1 moves params by minus the (clipped) gradient: global norm 5 -> 1.
    params = {"a": jnp.zeros(2), "b": jnp.zeros(1)}
    grads = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([4.0])}
    cfg = _cfg(name="sgd", learning_rate=1.0, warmup_steps=0, decay="constant", momentum=0.0)
    clipped = _one_update(cfg, params, grads)
    assert_close(clipped["a"], np.array([-0.6, 0.0]), 1e-6)
    assert_close(clipped["b"], np.array([-0.8]), 1e-6)
    # clip_norm=0 turns clipping off: the raw gradient; a gradient inside the norm is untouched.
    cfg.clip_norm = 0.0
    assert_close(_one_update(cfg, params, grads)["b"], np.array([-4.0]), 1e-6)
    cfg.clip_norm = 10.0
    assert_close(_one_update(cfg, params, grads)["b"], np.array([-4.0]), 1e-6)


def _adam_direction(g, eps):
    """Adam's first update (bias-corrected moments m = g, v = g^2), in float64."""
    g = np.asarray(g, np.float64)
    return g / (np.sqrt(g * g) + eps)


def _params_and_grads():
    rng = np.random.default_rng(0)
    params = {"dense": {"kernel": rng.normal(size=(3, 4)), "bias": rng.normal(size=4)},
              "norm": {"scale": 1.0 + rng.normal(size=4) * 0.1}}
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape), params)
    as32 = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)  # noqa: E731
    return params, grads, as32(params), as32(grads)


def test_adamw_decays_kernels_and_not_biases_or_layernorm_scales():
    params, grads, p32, g32 = _params_and_grads()
    lr, wd, eps = 0.01, 0.1, 1e-8
    cfg = _cfg(name="adamw", learning_rate=lr, warmup_steps=0, decay="constant",
               weight_decay=wd, eps=eps, clip_norm=0.0)
    got = _one_update(cfg, p32, g32)
    for path in (("dense", "kernel"), ("dense", "bias"), ("norm", "scale")):
        p, g = params[path[0]][path[1]], grads[path[0]][path[1]]
        decay = wd * p if path[1] == "kernel" else 0.0  # decoupled: lr * wd * w, kernels only
        assert_close(got[path[0]][path[1]], -lr * (_adam_direction(g, eps) + decay), 1e-5,
                     err_msg=str(path))
    # The same mask as optax's own adamw given it.
    ref = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=eps, weight_decay=wd, mask=optim.decay_mask)
    want, _ = ref.update(g32, ref.init(p32), p32)
    assert_close(got, want, 1e-6)


def test_lamb_scales_each_update_by_its_trust_ratio():
    params, grads, p32, g32 = _params_and_grads()
    params["dense"]["bias"] = np.zeros(4)  # ||w|| = 0: the trust ratio falls back to 1
    p32["dense"]["bias"] = jnp.zeros(4)
    lr, wd, eps = 0.01, 0.1, 1e-6
    cfg = _cfg(name="lamb", learning_rate=lr, warmup_steps=0, decay="constant",
               weight_decay=wd, eps=eps, clip_norm=0.0)
    got = _one_update(cfg, p32, g32)
    for path in (("dense", "kernel"), ("dense", "bias"), ("norm", "scale")):
        p, g = params[path[0]][path[1]], grads[path[0]][path[1]]
        u = _adam_direction(g, eps) + (wd * p if path[1] == "kernel" else 0.0)
        w_norm, u_norm = np.linalg.norm(p), np.linalg.norm(u)
        ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
        assert_close(got[path[0]][path[1]], -lr * ratio * u, 1e-5, err_msg=str(path))
    assert not np.allclose(np.linalg.norm(got["dense"]["kernel"]),
                           lr * np.linalg.norm(_adam_direction(grads["dense"]["kernel"], eps)))


def test_adafactor_is_optax_adafactor_with_the_schedule_mask_and_clipping():
    """zoo's Adafactor: optax.adafactor (factored second moments for the 130 x 130 kernel) at the
    warmup schedule's rate of each step, weight decay on kernels only, after global clipping."""
    rng = np.random.default_rng(1)
    params = {"dense": {"kernel": jnp.asarray(rng.normal(size=(130, 130)), jnp.float32),
                        "bias": jnp.asarray(rng.normal(size=130), jnp.float32)}}
    cfg = _cfg(name="adafactor", learning_rate=0.01, warmup_steps=4, total_steps=10,
               decay="linear", weight_decay=0.1, clip_norm=1.0)
    ours = optim.make_optimizer(cfg)
    rates = iter([0.0, 0.0025, 0.005, 0.0075])  # linear warmup 0 -> 0.01 over 4 steps
    ref = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adafactor(lambda _: next(rates), weight_decay_rate=0.1,
                                      weight_decay_mask=optim.decay_mask))
    state_ours, state_ref, p_ours, p_ref = ours.init(params), ref.init(params), params, params
    for _ in range(4):
        grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
        u_ours, state_ours = ours.update(grads, state_ours, p_ours)
        u_ref, state_ref = ref.update(grads, state_ref, p_ref)
        assert_close(u_ours, u_ref, 1e-5)
        p_ours, p_ref = optax.apply_updates(p_ours, u_ours), optax.apply_updates(p_ref, u_ref)
    # The kernel's second moment really is factored (row and column statistics, not 130 x 130).
    factored = [x.shape for x in jax.tree.leaves(state_ours) if x.ndim == 1 and x.size == 130]
    assert factored, jax.tree.map(np.shape, state_ours)


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_decays_end_at_end_learning_rate(decay):
    # nanoGPT's recipe: cosine from 1e-3 to min_lr 1e-4, not to 0.
    schedule = optim.make_schedule(_cfg(learning_rate=1e-3, warmup_steps=100, total_steps=2000,
                                        decay=decay, end_learning_rate=1e-4))
    np.testing.assert_allclose(float(schedule(100)), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(2000)), 1e-4, rtol=1e-5)
    np.testing.assert_allclose(float(schedule(1050)), 5.5e-4, rtol=1e-5)  # midway either way
    with pytest.raises(ValueError, match="end_learning_rate"):
        optim.make_schedule(_cfg(learning_rate=1e-3, decay=decay, end_learning_rate=2e-3))


def test_decay_mask_exempts_every_bias_of_the_rnn_lm():
    # The GRU's recurrent_bias and a tied RNN LM's output_bias are 1-D biases too: PyTorch's
    # (and nanoGPT's) dim >= 2 decay groups leave them alone, and so must the mask.
    from zoo.models import rnnlm

    cfg = rnnlm.RNNLMConfig(vocab_size=11, cell="gru", embed_dim=8, hidden_size=8,
                            num_layers=1, tie_embeddings=True)
    params = rnnlm.RNNLM(cfg).init(jax.random.key(0), jnp.ones((2, 3), jnp.int32))["params"]
    flat = {"/".join(k.key for k in path if isinstance(k, jax.tree_util.DictKey)): decays
            for path, decays in jax.tree_util.tree_leaves_with_path(optim.decay_mask(params))}
    assert flat == {"embed/embedding": True, "layer_0/input_kernel": True,
                    "layer_0/recurrent_kernel": True, "layer_0/bias": False,
                    "layer_0/recurrent_bias": False, "output_bias": False}, flat
