"""What the recurrent tests share: sizes, the cell variants, random inputs and parameters."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from zoo.nn.recurrent import Bidirectional
from zoo.train import partitioning

B, T, D, H = 2, 5, 6, 8

VARIANTS = {
    "rnn": {"cell": "rnn"},
    "lstm": {"cell": "lstm"},
    "lstm_peephole": {"cell": "lstm", "peephole": True},
    "lstm_coupled": {"cell": "lstm", "coupled": True},
    "lstm_coupled_peephole": {"cell": "lstm", "coupled": True, "peephole": True},
    "gru": {"cell": "gru"},
}


def random_inputs(b=B, t=T, d=D, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(b, t, d)), jnp.float32)


def random_params(model, x, seed=1, **call_kw):
    """Parameter shapes from an abstract init, every leaf drawn from N(0, 0.5²): no init compile,
    and zero-initialised biases/peepholes or the forget-gate 1.0 cannot hide a wiring bug."""
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), x, **call_kw))["params"]
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda a: jnp.asarray(rng.normal(scale=0.5, size=a.shape), jnp.float32), shapes
    )


def jit_apply(model, params, *args, **kw):
    """Jitted apply: one compile per call instead of eager op-by-op dispatch."""
    return jax.jit(functools.partial(model.apply, **kw))({"params": params}, *args)


def sharded_bidirectional_lstm():
    """A Bidirectional LSTM on a (data 4, tensor 2) mesh under the default rules: (model, x,
    lengths, host params, the same params placed as the rules place them, mesh, rules)."""
    lengths = jnp.array([5, 3, 1, 4])
    x = random_inputs(b=4)
    model = Bidirectional(hidden_size=H, cell="lstm")
    rules = partitioning.DEFAULT_RULES
    mesh = partitioning.make_mesh(data=4, fsdp=1, tensor=2)
    # Random values placed by the default rules (the same mapping sharded_init uses).
    params = {"params": random_params(model, x, lengths=lengths)}
    abstract = jax.eval_shape(model.init, jax.random.key(0), x, lengths)
    sharded = jax.device_put(
        params, nn.unbox(partitioning.logical_sharding(abstract, mesh, rules)))
    return model, x, lengths, params, sharded, mesh, rules


def bidirectional_loss(model, lengths):
    """loss(params, x) reading every output and both final carries nonlinearly: every cotangent
    a backward pass receives is nonzero."""

    def loss(p, x):
        out, carries = model.apply(p, x, lengths)
        return jnp.sum(out**2) + sum(jnp.sum(jnp.sin(c)) for c in jax.tree.leaves(carries))

    return loss
