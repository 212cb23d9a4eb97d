"""The NNLM job through the one training loop, on the GPT task's data pipeline."""

import contextlib
import io
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import gpt as gpt_config
from configs import nnlm as nnlm_config
from zoo import decoding, tasks
from zoo.commands import jobs
from zoo.data.tokenizers.base import EOS_ID
from zoo.models import nnlm
from zoo.tasks.lm import LanguageModelTask
from zoo.tasks.nnlm import NNLMTask, window_decoder
from zoo.train import loop

PROMPT = "lives in"


def _config(cache_dir, **train):
    """configs/nnlm.py:size=tiny shrunk to test size (only smaller numbers)."""
    config = nnlm_config.get_config("size=tiny")
    config.data.update(seq_len=16, batch_size=8, eval_batch_size=8, vocab_size=128,
                       synthetic_entities=100, cache_dir=str(cache_dir))
    config.train.update(dict(dict(steps=100, log_every=25, eval_every=100,
                                  checkpoint_every=1000, tensorboard=False), **train))
    # A tenth of the steps of the real tiny run: a larger learning rate gets it out of the
    # early plateau of a small-initialised tanh layer within them.
    config.optim.update(learning_rate=1e-2, warmup_steps=5)
    config.sample.update(num=2, prompt=PROMPT, max_len=12)
    return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("nnlm")
    workdir = str(root / "run")
    out = io.StringIO()
    # One device: the sharded path is proven where it can fail (the 2x2x2 sharded eval below
    # equals the unsharded one); 8 fake devices would only triple this training's time.
    with contextlib.redirect_stdout(out):
        jobs.train(_config(root / "cache"), workdir, devices=jax.devices()[:1])
    return root, workdir, out.getvalue()


def test_registered_under_nnlm():
    assert tasks.get("nnlm") is NNLMTask


def test_window_decoder_equals_greedy_over_the_full_sequence():
    """Decoding keeps only the last n-1 tokens; the full forward pass over the whole sequence
    must choose the same tokens (prefilled prompt included)."""
    cfg = nnlm.NNLMConfig(vocab_size=16, context=3, embed_dim=8, hidden_dim=8)
    model = nnlm.NNLM(cfg)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), np.zeros((1, 4), np.int32)))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 1.0, x.shape).astype(np.float32),
                          params["params"])
    params["U"]["bias"][EOS_ID] = -100.0  # never stop early: every row runs to max_len
    # Prompts longer and shorter than the window: the first choices of the BOS-only row are
    # made while the window still reaches before the sequence start.
    prompts, lengths = np.array([[2, 9, 4, 7], [2, 0, 0, 0]], np.int32), np.array([4, 1])
    # One compiled full forward over a [1, 10] buffer; positions after the last chosen token
    # hold 0 and cannot affect it (the window is causal, see tests/models/test_nnlm.py).
    forward = jax.jit(lambda seq: model.apply({"params": params}, seq))
    expected = np.zeros((2, 10), np.int32)
    for b, n in enumerate(lengths):
        expected[b, :n] = prompts[b, :n]
        for t in range(n, 10):
            expected[b, t] = int(np.argmax(forward(expected[b : b + 1])[0, t - 1]))
    stepwise = decoding.greedy(window_decoder(model, params, 2), prompts, lengths, max_len=10)
    np.testing.assert_array_equal(stepwise.tokens, expected)
    # Without prompt_lengths the prompt's first tokens go through the step as one chunk.
    prefilled = decoding.greedy(window_decoder(model, params, 1), prompts[:1], max_len=10)
    np.testing.assert_array_equal(prefilled.tokens, expected[:1])


def test_loss_falls_and_perplexity_beats_unigram(trained):
    _, workdir, _ = trained
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [25, 50, 75, 100]
    assert train[-1]["loss"] < train[0]["loss"] - 1.0
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    # Held-out text: the 4-token window predicts better than word frequencies alone.
    assert summary["perplexity"] < summary["unigram_perplexity"] / 3


def test_samples_continue_the_prompt(trained):
    _, _, stdout = trained
    samples = stdout.split("samples:\n", 1)[1].splitlines()[:2]
    assert len(samples) == 2 and all(s.strip().startswith(PROMPT) for s in samples)
    assert all(len(s.split()) > len(PROMPT.split()) for s in samples)


@pytest.mark.parametrize("ours,gpts", [("size=tiny", "size=tiny"), ("size=base", "size=124M")])
def test_config_data_block_is_the_gpt_jobs(ours, gpts):
    assert nnlm_config.get_config(ours).data.to_dict() == gpt_config.get_config(gpts).data.to_dict()


def test_rows_and_baseline_are_the_gpt_tasks(trained, tmp_path):
    """Same tokens, targets and weights as the GPT job on the same data config: the two
    perplexities are means over the same held-out targets."""
    root, _, _ = trained
    config = _config(root / "cache")
    gpt = gpt_config.get_config("size=tiny")
    gpt.data = config.data
    lm = LanguageModelTask(gpt, str(tmp_path / "gpt"))
    ours = NNLMTask(config, str(tmp_path / "nnlm"))
    for split in ("train_rows", "eval_rows"):
        for key, value in getattr(lm, split).items():
            np.testing.assert_array_equal(getattr(ours, split)[key], value, err_msg=key)
    assert ours.baselines() == lm.baselines()


def test_tensor_and_fsdp_sharded_eval_equals_unsharded(trained, tmp_path):
    root, _, _ = trained
    config = _config(root / "cache")
    config.mesh.update(data=2, fsdp=2, tensor=2)
    setup = jobs.build(config, str(tmp_path))
    # The hidden and vocab axes really are split over `tensor`, the embedding axis over `fsdp`.
    specs = {k: tuple(setup.state_sharding.params[k]["kernel"].spec) for k in ("H", "U", "W")}
    assert specs == {"H": (None, "fsdp", "tensor"), "U": (None, "tensor"),
                     "W": (None, "fsdp", "tensor")}
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
