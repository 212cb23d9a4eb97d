"""The RNN LM job through the one training loop, on the GPT task's data pipeline."""

import contextlib
import io
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import gpt as gpt_config
from configs import rnnlm as rnnlm_config
from zoo import decoding, tasks
from zoo.commands import jobs
from zoo.data.tokenizers.base import EOS_ID
from zoo.models import rnnlm
from zoo.tasks.rnnlm import RNNLanguageModelTask, carry_decoder
from zoo.train import loop

PROMPT = "lives in"


def _config(cache_dir, **train):
    """configs/rnnlm.py:size=tiny shrunk to test size (only smaller numbers)."""
    config = rnnlm_config.get_config("size=tiny")
    config.data.update(seq_len=16, batch_size=8, eval_batch_size=8, vocab_size=128,
                       synthetic_entities=100, cache_dir=str(cache_dir))
    config.train.update(dict(dict(steps=100, log_every=25, eval_every=100,
                                  checkpoint_every=1000, tensorboard=False), **train))
    # A quarter of the real tiny run's steps, on a smaller batch: a larger learning rate gets
    # the LSTM off the unigram plateau within them (1e-2 leaves it near perplexity 26).
    config.optim.update(learning_rate=3e-2, warmup_steps=5)
    config.sample.update(num=2, prompt=PROMPT, max_len=12)
    return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("rnnlm")
    workdir = str(root / "run")
    out = io.StringIO()
    # One device: the sharded paths are proven where they can fail (the sharded eval below,
    # and the layers' sharded == single-device tests); 8 fake devices would only triple
    # this training's time.
    with contextlib.redirect_stdout(out):
        jobs.train(_config(root / "cache"), workdir, devices=jax.devices()[:1])
    return root, workdir, out.getvalue()


def test_registered_under_rnnlm_and_cell_is_a_variant():
    assert tasks.get("rnnlm") is RNNLanguageModelTask
    assert rnnlm_config.get_config("cell=gru").model.cell == "gru"
    with pytest.raises(ValueError, match="variant key 'layers'"):
        rnnlm_config.get_config("layers=3")


def test_carry_decoder_equals_greedy_over_the_full_sequence():
    """Decoding carries only the layers' states; the full forward pass over the whole sequence
    must choose the same tokens (prefilled prompt included)."""
    cfg = rnnlm.RNNLMConfig(vocab_size=16, cell="lstm", embed_dim=8, hidden_size=8)
    model = rnnlm.RNNLM(cfg)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), np.zeros((1, 4), np.int32)))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 1.0, x.shape).astype(np.float32),
                          params["params"])
    params["output"]["bias"][EOS_ID] = -100.0  # never stop early: every row runs to max_len
    prompts, lengths = np.array([[2, 9, 4, 7], [2, 0, 0, 0]], np.int32), np.array([4, 1])
    # One compiled full forward over a [1, 10] buffer; positions after the last chosen token
    # hold 0 and cannot affect it (the recurrence is causal).
    forward = jax.jit(lambda seq: model.apply({"params": params}, seq))
    expected = np.zeros((2, 10), np.int32)
    for b, n in enumerate(lengths):
        expected[b, :n] = prompts[b, :n]
        for t in range(n, 10):
            expected[b, t] = int(np.argmax(forward(expected[b : b + 1])[0, t - 1]))
    stepwise = decoding.greedy(carry_decoder(model, params, 2), prompts, lengths, max_len=10)
    np.testing.assert_array_equal(stepwise.tokens, expected)
    # Without prompt_lengths the prompt's first tokens go through the step as one chunk.
    prefilled = decoding.greedy(carry_decoder(model, params, 1), prompts[:1], max_len=10)
    np.testing.assert_array_equal(prefilled.tokens, expected[:1])


@pytest.mark.slow
def test_loss_falls_and_perplexity_beats_unigram(trained):
    _, workdir, _ = trained
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [25, 50, 75, 100]
    assert train[-1]["loss"] < train[0]["loss"] - 1.0
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    # Held-out text: the recurrent state predicts better than word frequencies alone.
    assert summary["perplexity"] < summary["unigram_perplexity"] / 3


@pytest.mark.slow
def test_samples_continue_the_prompt(trained):
    _, _, stdout = trained
    samples = stdout.split("samples:\n", 1)[1].splitlines()[:2]
    assert len(samples) == 2 and all(s.strip().startswith(PROMPT) for s in samples)
    assert all(len(s.split()) > len(PROMPT.split()) for s in samples)


@pytest.mark.parametrize("ours,gpts", [("size=tiny", "size=tiny"),
                                       ("size=base,cell=gru", "size=124M")])
def test_config_data_block_is_the_gpt_jobs(ours, gpts):
    assert (rnnlm_config.get_config(ours).data.to_dict()
            == gpt_config.get_config(gpts).data.to_dict())


@pytest.mark.slow
def test_tensor_and_fsdp_sharded_eval_equals_unsharded(trained, tmp_path):
    root, _, _ = trained
    config = _config(root / "cache")
    config.mesh.update(data=2, fsdp=2, tensor=2)
    setup = jobs.build(config, str(tmp_path))
    # The hidden units and the vocab really are split over `tensor`, the embedding over `fsdp`.
    specs = jax.tree.map(lambda s: tuple(s.spec), setup.state_sharding.params)
    assert specs["layer_0"]["recurrent_kernel"] == (None, None, "tensor")
    assert specs["output"]["kernel"] == ("fsdp", "tensor")
    assert specs["embed"]["embedding"] == ("tensor", "fsdp")
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        sharded = loop.evaluate(setup.task, loop.make_eval_step(setup), setup.state.params,
                                setup.batch_sharding)
    # The same params gathered to the host and run with no mesh (one device, no constraints).
    params = jax.device_get(setup.state.params)
    loss_fn = jax.jit(lambda p, b: setup.task.loss_fn(p, b, jax.random.key(0), train=False))
    sums = {}
    for batch in setup.task.eval_batches(0, 1):
        for k, v in loss_fn(params, batch).items():
            sums[k] = sums.get(k, 0.0) + float(v)
    plain = setup.task.summarize(sums)
    assert sharded["tokens"] == plain["tokens"] > 0
    assert sharded["perplexity"] == pytest.approx(plain["perplexity"], rel=1e-5)
