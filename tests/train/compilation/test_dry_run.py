"""The dry run's per-device figures match what a real sharded init allocates, without compiling."""

import jax
import pytest

from zoo.commands import jobs
from zoo.nn.transformer import stack_activation_bytes
from zoo.train import loop


def _device0_bytes(tree):
    device = jax.devices()[0]
    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
               if s.device == device)


def test_dry_run_matches_the_real_sharded_state_and_compiles_nothing(tiny_lm_config, tmp_path):
    config = tiny_lm_config()
    config.mesh.update(data=2, fsdp=2, tensor=2)
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, *a, **k: compiles.append(event) if "backend_compile" in event else None)
    figures = jobs.dry_run(config, str(tmp_path))
    assert compiles == []
    setup = jobs.build(config, str(tmp_path))
    assert figures["param_bytes_per_device"] == _device0_bytes(setup.state.params)
    assert figures["optimizer_bytes_per_device"] == _device0_bytes(setup.state.opt_state)
    assert figures["params"] == sum(x.size for x in jax.tree.leaves(setup.state.params))
    tokens = config.data.batch_size * config.data.seq_len
    assert figures["flops_per_step"] == pytest.approx(setup.task.flops_per_token() * tokens)
    assert figures["activation_bytes_per_device"] > 0


def test_activation_estimate_follows_remat_and_tensor_parallelism():
    kw = dict(batch=4, seq_len=128, hidden=256, heads=4, layers=6, mlp=1024, dtype_bytes=2)
    none = stack_activation_bytes(remat="none", **kw)
    # Hand count for one layer and token: 6h + 4h + 2*mlp + 2*heads*seq elements; 6 layers
    # stored, plus one layer's activation gradients during its backward pass.
    per_token = 6 * 256 + 4 * 256 + 2 * 1024 + 2 * 4 * 128
    assert none == 4 * 128 * (6 + 1) * per_token * 2
    assert stack_activation_bytes(remat="full", **kw) < none / 3
    assert stack_activation_bytes(remat="none", tensor_parallel=4, **kw) < none


@pytest.mark.slow
def test_blockwise_attention_keeps_no_weights_and_the_estimate_follows_xla(tiny_lm_config,
                                                                           tmp_path):
    """With backend='blockwise' a layer keeps a log-sum-exp per query and head, not the
    [heads, n, n] weights: the estimate drops the n^2 term, and for a GPT at 1,024 tokens the
    dry run's activation figure falls as XLA's compiled temporaries of the real train step
    do (each within 2x of the other's ratio)."""
    kw = dict(batch=4, seq_len=128, hidden=256, heads=4, layers=6, mlp=1024, dtype_bytes=2,
              remat="none")
    per_token = 6 * 256 + 4 * 256 + 2 * 1024 + 4
    assert stack_activation_bytes(backend="blockwise", **kw) == (
        4 * 128 * (6 + 1) * per_token * 2)

    estimated, compiled = {}, {}
    for backend in ("einsum", "blockwise"):
        config = tiny_lm_config()
        config.data.update(seq_len=1024, batch_size=2)
        config.model.update(backend=backend, attention_block=128)
        workdir = str(tmp_path / backend)
        estimated[backend] = jobs.dry_run(config, workdir, jax.devices()[:1])[
            "activation_bytes_per_device"]
        setup = jobs.build(config, workdir, jax.devices()[:1])
        batch = setup.task.init_batch()
        memory = loop.make_train_step(setup, config).lower(setup.state, batch).compile()
        compiled[backend] = memory.memory_analysis().temp_size_in_bytes
    estimated_ratio = estimated["einsum"] / estimated["blockwise"]
    compiled_ratio = compiled["einsum"] / compiled["blockwise"]
    assert estimated_ratio > 4 and compiled_ratio > 4
    assert 0.5 < estimated_ratio / compiled_ratio < 2.0


def test_each_model_family_counts_its_output_on_top_of_the_stack():
    """The dry run's activations come from the model family (beside its flops_per_token): the
    Transformer stack's count plus what each family's output keeps: GPT's two float32 [B, T, V]
    buffers, BERT's three at the P masked positions (none for the span / class heads)."""
    from zoo.models import bert, gpt

    b, t, tp = 4, 32, 2
    g = gpt.config_for_size("tiny", vocab_size=100)
    stack = stack_activation_bytes(b, t, g.embed_dim, g.num_heads, g.num_layers, g.mlp_dim, 4,
                                   g.remat, tp, g.backend)
    assert gpt.activation_bytes(g, b, t, tp) == stack + 2 * b * t * 100 * 4 / tp
    e = bert.config_for_size("tiny", vocab_size=120)
    stack = stack_activation_bytes(b, t, e.hidden_size, e.num_heads, e.num_layers,
                                   e.intermediate_size, 4, e.remat, tp, e.backend)
    assert bert.activation_bytes(e, b, t, 0, tp) == stack
    assert bert.activation_bytes(e, b, t, 5, tp) == stack + 3 * b * 5 * 120 * 4 / tp


def test_the_encoder_decoder_families_count_their_own_activations():
    """Translation's activations come from its model family too: the Transformer's encoder
    stack over S plus a decoder stack of 2 L layers over T (cross-attention counted as a second
    self-attention), and the RNN seq2seq's count grows with the source, the target and the
    attention's keys, and splits over the tensor axis."""
    from zoo.models import encoder_decoder, seq2seq

    b, s, t, tp = 4, 24, 16, 2
    c = encoder_decoder.config_for_size("tiny", vocab_size=100)
    encoder = stack_activation_bytes(b, s, c.hidden_size, c.num_heads, c.num_encoder_layers,
                                     c.mlp_dim, 4, c.remat, tp, c.backend)
    decoder = stack_activation_bytes(b, t, c.hidden_size, c.num_heads, 2 * c.num_decoder_layers,
                                     c.mlp_dim, 4, c.remat, tp, c.backend)
    assert encoder_decoder.activation_bytes(c, b, s, t, tp) == encoder + decoder
    plain = seq2seq.config_for_size("tiny", vocab_size=100, attention="none")
    additive = seq2seq.config_for_size("tiny", vocab_size=100, attention="additive")
    count = seq2seq.activation_bytes
    assert count(plain, b, s, t, 1) < count(plain, b, 2 * s, t, 1) < count(plain, 2 * b, 2 * s,
                                                                             t, 1)
    assert count(plain, b, s, t, 1) < count(additive, b, s, t, 1)
    assert count(plain, b, s, t, 2) < count(plain, b, s, t, 1)
