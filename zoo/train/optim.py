"""Optimizers and learning-rate schedules from config (optax)."""

import jax
import jax.numpy as jnp
import ml_collections
import optax

from zoo.errors import ConfigError


def make_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
    """Linear warmup to `learning_rate`, then `decay` over `total_steps`.

    decay: 'constant' | 'linear' (to `end_learning_rate`, default 0, at total_steps) | 'cosine'
    (to `end_learning_rate`: nanoGPT's min_lr, e.g. 1e-4 under a peak of 1e-3) | 'inverse_sqrt'
    (the Transformer paper: lr * min(step / warmup, sqrt(warmup / step)), which with
    lr = d_model^-0.5 * warmup^-0.5 is d^-0.5 * min(step^-0.5, step * warmup^-1.5)).
    """
    peak, warmup, total = cfg.learning_rate, int(cfg.warmup_steps), int(cfg.total_steps)
    decay = cfg.decay
    end = float(cfg.get("end_learning_rate", 0.0))  # older configs lack the field: 0
    if decay in ("linear", "cosine") and not 0.0 <= end <= peak:
        raise ConfigError(f"config.optim.end_learning_rate={end} must lie in [0, learning_rate="
                          f"{peak}]: the {decay} decay ends there")
    if decay == "inverse_sqrt":
        w = max(warmup, 1)

        def inverse_sqrt(step):
            step = jnp.maximum(step, 1).astype(jnp.float32)
            return peak * jnp.minimum(step / w, jnp.sqrt(w / step))

        return inverse_sqrt
    warm = optax.linear_schedule(0.0, peak, max(warmup, 1))
    remaining = max(total - warmup, 1)
    if decay == "constant":
        after = optax.constant_schedule(peak)
    elif decay == "linear":
        after = optax.linear_schedule(peak, end, remaining)
    elif decay == "cosine":
        # alpha: the fraction of the peak the cosine ends at (end + (peak - end) * cos-factor).
        after = optax.cosine_decay_schedule(peak, remaining, alpha=end / peak if peak else 0.0)
    else:
        raise ConfigError(
            f"config.optim.decay must be constant, linear, cosine or inverse_sqrt, got {decay!r}"
        )
    if warmup <= 0:
        return after
    return optax.join_schedules([warm, after], [warmup])


def decay_mask(params):
    """True for parameters that get weight decay: not biases, not LayerNorm scales.

    Decided by name, not ndim: a scanned stack gives every bias a leading 'layers' axis. A bias
    is any name ending in 'bias' (also the GRU's 'recurrent_bias' and a tied RNN LM's
    'output_bias', 1-D vectors PyTorch's and nanoGPT's dim >= 2 rule leaves undecayed);
    embedding tables are matrices and decay, as in nanoGPT.
    Works through nn.LogicallyPartitioned boxes (the mask keeps the params' tree structure).
    """

    def wants_decay(path, _):
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return not (names[-1] == "scale" or names[-1].endswith("bias"))

    return jax.tree_util.tree_map_with_path(wants_decay, params)


def make_optimizer(cfg: ml_collections.ConfigDict, frozen: tuple[str, ...] = ()
                   ) -> optax.GradientTransformation:
    """The optimizer named by `cfg.name` with clipping and the schedule of make_schedule.

    `frozen`: top-level params subtrees (e.g. ('bert',) for a frozen encoder) that never change:
    their updates are zero, they carry no optimizer state (no Adam moments for a frozen BERT) and
    they do not count toward the clipping norm.
    """
    opt = _base_optimizer(cfg)
    if not frozen:
        return opt

    def labels(params):
        def label(path, _):
            return "frozen" if path[0].key in frozen else "train"

        return jax.tree_util.tree_map_with_path(label, params)

    return optax.multi_transform({"train": opt, "frozen": optax.set_to_zero()}, labels)


def _base_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
    schedule = make_schedule(cfg)
    name = cfg.name
    if name == "adamw":
        opt = optax.adamw(
            schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
            mask=decay_mask,
        )
    elif name == "lamb":
        opt = optax.lamb(
            schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
            mask=decay_mask,
        )
    elif name == "adafactor":
        opt = optax.adafactor(schedule, weight_decay_rate=cfg.weight_decay or None,
                              weight_decay_mask=decay_mask)
    elif name == "sgd":
        opt = optax.sgd(schedule, momentum=cfg.momentum or None, nesterov=False)
    else:
        raise ConfigError(
            f"config.optim.name must be adamw, lamb, adafactor or sgd, got {name!r}"
        )
    if cfg.clip_norm:
        opt = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)
    return opt


def default_optim_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        dict(
            name="adamw", learning_rate=1e-3, warmup_steps=100, total_steps=1000,
            decay="cosine", end_learning_rate=0.0, b1=0.9, b2=0.98, eps=1e-9,
            weight_decay=0.01, momentum=0.9,
            clip_norm=1.0,
        )
    )

