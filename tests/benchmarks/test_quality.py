"""benchmarks.quality: the bytes both sides get (vocabularies, splits, batches, windows), the
peer's copy of zoo's learning-rate schedule and decay groups, and (acceptance) a --quick run."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import quality_data, quality_sides
from tests import process_env
from zoo.train import optim

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_char_corpus_is_nanogpts_vocabulary_and_90_10_split():
    text = "hello world\n\nto be or not"
    corpus = quality_data.char_corpus(text)
    assert corpus.chars == "".join(sorted(set(text)))
    assert corpus.chars[0] == "\n" and corpus.vocab_size == len(set(text))
    cut = int(len(text) * 0.9)
    decoded = lambda ids: "".join(corpus.chars[i] for i in ids)  # noqa: E731
    assert decoded(corpus.train) == text[:cut] and decoded(corpus.val) == text[cut:]


def test_get_batch_is_nanogpts_offsets_and_shift():
    data = np.arange(100, dtype=np.int32)
    x, y = quality_data.get_batch(data, np.random.default_rng(3), batch=5, block=8)
    offsets = np.random.default_rng(3).integers(0, 100 - 8, size=5)
    np.testing.assert_array_equal(x[:, 0], offsets)
    np.testing.assert_array_equal(x, offsets[:, None] + np.arange(8))
    np.testing.assert_array_equal(y, x + 1)
    with pytest.raises(ValueError, match="too short"):
        quality_data.get_batch(data[:8], np.random.default_rng(0), 2, 8)


def test_word_vocab_keeps_train_words_seen_twice_lowercased_with_eos():
    train = quality_data.sentences("The cat sat .\nthe dog sat\n\nA cat .\n")
    words = quality_data.word_vocab(train)
    # counts: the 2, cat 2, sat 2, . 2; dog 1, a 1 -> <unk>
    assert words == ("<unk>", "<eos>", ".", "cat", "sat", "the")
    ids = quality_data.encode_words(quality_data.sentences("THE bird sat\n\nCat .\n"), words)
    assert [words[i] for i in ids] == ["the", "<unk>", "sat", "<eos>", "cat", ".", "<eos>"]


def test_windows_stream_contiguously_into_batch_columns():
    stream = np.arange(2 * 3 * 4 + 5, dtype=np.int32)  # 29 tokens: column 14, 3 windows of 4
    x, y = quality_data.windows(stream, batch=2, steps=4)
    assert x.shape == y.shape == (3, 2, 4)
    np.testing.assert_array_equal(y, x + 1)  # the next token, always
    np.testing.assert_array_equal(x[:, 0].ravel(), np.arange(12))  # row 0 reads 0..11 in order
    np.testing.assert_array_equal(x[:, 1].ravel(), 14 + np.arange(12))  # row 1 from column 14
    order = quality_data.window_order(3, 7, seed=5)
    assert sorted(order[:3]) == sorted(order[3:6]) == [0, 1, 2]  # whole epochs, reshuffled
    np.testing.assert_array_equal(order, quality_data.window_order(3, 7, seed=5))


def test_both_sides_receive_identical_batches():
    seen = {}

    class Recorder:
        def __init__(self, name):
            self.name, seen[name] = name, []

        def step(self, x, y):
            seen[self.name].append((x.copy(), y.copy()))
            x[:] = -1  # a side that wrote into its batch must not change the other's
            return 0.0

        def evaluate(self, x, y):
            return float(x.sum())

    data = np.arange(1000, dtype=np.int32) % 37
    batches = quality_data.char_batches(data, seed=1, count=6, batch=3, block=5)
    out = quality_sides.train_in_turns([Recorder("zoo"), Recorder("peer")], batches, 6, 3,
                                       {"val": (data[:10, None], data[1:11, None])},
                                       log=lambda _: None)
    assert len(seen["zoo"]) == len(seen["peer"]) == 6
    expected = list(quality_data.char_batches(data, seed=1, count=6, batch=3, block=5))
    for side in ("zoo", "peer"):
        for (x, y), (ex, ey) in zip(seen[side], expected):
            np.testing.assert_array_equal(x, ex)
            np.testing.assert_array_equal(y, ey)
        assert [p[0] for p in out[side]["curve"]] == [0, 3, 6]


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_peer_schedule_is_zoos_schedule(decay):
    cfg = optim.default_optim_config()
    cfg.update(learning_rate=1e-3, warmup_steps=100, total_steps=2000, decay=decay,
               end_learning_rate=1e-4)
    schedule = optim.make_schedule(cfg)
    for step in (0, 1, 50, 99, 100, 101, 700, 1999, 2000):
        assert quality_sides.peer_learning_rate(cfg, step) == pytest.approx(
            float(schedule(step)), rel=1e-5, abs=1e-9), step


def test_peer_decay_groups_are_zoos_decay_mask_on_the_same_gpt():
    import jax
    from flax import traverse_util

    from benchmarks import peers, quality_gpt, step_jobs

    config = quality_gpt.job_config(quality_gpt.Recipe(layers=2, width=32, block=16), 20, 0)
    task = step_jobs.make_task("gpt", config, 20)
    params = jax.eval_shape(task.init_params, jax.random.key(0))
    mask = traverse_util.flatten_dict(optim.decay_mask(params))
    model = peers.hf_gpt2(task.model_config)
    decay, no_decay = quality_sides.decay_groups(model, 0.1)
    count = lambda ps: sum(p.numel() for p in ps["params"])  # noqa: E731
    shapes = traverse_util.flatten_dict(params)
    size = lambda keys: sum(int(np.prod(shapes[k].value.shape)) for k in keys)  # noqa: E731
    assert count(decay) == size([k for k, d in mask.items() if d.value])
    assert count(no_decay) == size([k for k, d in mask.items() if not d.value])
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0


def test_torch_rnnlm_has_zoos_parameters_and_init_family():
    import torch

    from benchmarks import quality_rnn

    import jax

    for cell in ("lstm", "gru"):
        config = quality_rnn.job_config(cell, quality_rnn.QUICK, 50, 0)
        task = quality_rnn.WindowLM(config, 50)
        module, _ = quality_rnn.torch_rnnlm(task.model_config, seed=0)
        zoo_count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(
            jax.eval_shape(task.init_params, jax.random.key(0))))
        trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
        assert trainable == zoo_count, cell
        h = task.model_config.hidden_size
        w_hh = module.rnn.weight_hh_l0.detach()
        gate = w_hh[:h]
        torch.testing.assert_close(gate @ gate.T, torch.eye(h), atol=1e-4, rtol=0)
        bias = module.rnn.bias_ih_l0.detach()
        forget = torch.zeros_like(bias)
        if cell == "lstm":
            forget[h:2 * h] = 1.0
        torch.testing.assert_close(bias, forget)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_rnn_pair_sides_from_the_same_start_take_the_same_steps(cell):
    """The training itself (loss, gradients, clipping, AdamW and its decay groups, the
    schedule) is the same on both sides: from zoo's initial params, copied into the peer, three
    steps on the same windows leave both with the same params. Any gap the full pair shows is
    then the two sides' different init draws (and float rounding), not the training."""
    import jax
    from flax import linen as nn

    from benchmarks import quality_rnn

    recipe = quality_rnn.Recipe(steps=3, batch=4, window=6, embed=16, hidden=16, layers=2)
    config = quality_rnn.job_config(cell, recipe, 40, 0)
    config.optim.update(warmup_steps=1, weight_decay=0.1)  # decay large enough to show
    task = quality_rnn.WindowLM(config, 40)
    zoo = quality_sides.ZooSide(config, task, eval_rows=4)
    try:
        module, logits_fn = quality_rnn.torch_rnnlm(task.model_config, seed=0)
        initial = nn.meta.unbox(jax.device_get(zoo.state.params))
        quality_rnn.load_zoo_params(module, initial, task.model_config)
        peer = quality_sides.TorchSide(module, logits_fn, config.optim, eval_rows=4)
        rng = np.random.default_rng(0)
        for _ in range(3):
            x = rng.integers(0, 40, (4, 6)).astype(np.int32)
            y = rng.integers(0, 40, (4, 6)).astype(np.int32)
            losses = [side.step(x.copy(), y.copy()) for side in (zoo, peer)]
            assert losses[0] == pytest.approx(losses[1], abs=1e-5)
        trained = nn.meta.unbox(jax.device_get(zoo.state.params))
        reference, _ = quality_rnn.torch_rnnlm(task.model_config, seed=0)
        quality_rnn.load_zoo_params(reference, trained, task.model_config)
        for (name, got), want in zip(module.state_dict().items(),
                                     reference.state_dict().values()):
            np.testing.assert_allclose(got.numpy(), want.numpy(), atol=2e-5, err_msg=name)
        first, _ = quality_rnn.torch_rnnlm(task.model_config, seed=0)
        quality_rnn.load_zoo_params(first, initial, task.model_config)
        moved = max(float((a - b).abs().max()) for a, b in zip(
            module.state_dict().values(), first.state_dict().values()))
        assert moved > 1e-3  # the steps did move the params
    finally:
        zoo.close()


@pytest.mark.acceptance
def test_quick_run_learns_on_both_sides_and_they_agree(tmp_path):
    corpus = quality_data.write_fixture_corpus(str(tmp_path / "corpus"))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality", "--quick", "--corpus", corpus,
         "--out", str(out)], cwd=ROOT, env=process_env.process_env(), capture_output=True, text=True,
        timeout=1700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("quality.jsonl", "quality.md", "quality_gpt-char-shakespeare.png",
                 "quality_lstm-word-brown.png", "quality_gru-word-brown.png"):
        assert (out / name).stat().st_size > 0, name
    lines = [json.loads(line) for line in (out / "quality.jsonl").read_text().splitlines()]
    assert lines[0]["record"] == "header" and lines[0]["mode"] == "quick"
    records = lines[1:]
    assert {r["pair"] for r in records} == {"gpt-char-shakespeare", "lstm-word-brown",
                                            "gru-word-brown"}
    for r in records:
        uniform = math.log(r["vocab_size"])
        metric = r["metric"]
        zoo, peer = (r["sides"][s]["final"][metric] for s in ("zoo", "peer"))
        # Both learn: far below the uniform baseline (GPT: well below the unigram level too).
        assert zoo < 0.5 * uniform and peer < 0.5 * uniform, (r["pair"], zoo, peer, uniform)
        assert abs(zoo - peer) < 0.15, (r["pair"], zoo, peer)
        assert r["params"]["zoo"] == r["params"]["peer"], r["pair"]
        # The same number of steps on each side, each timed.
        assert len(r["sides"]["zoo"]["step_s"]) == len(r["sides"]["peer"]["step_s"]) > 0
    assert "zoo - peer" in (out / "quality.md").read_text()


def test_a_delegated_pair_that_fails_is_one_error_and_keeps_quality_md(tmp_path):
    """--pairs bert runs benchmarks.quality_bert with this command's arguments; its error
    (no Brown in --corpus) ends the command with exit 2, and the LM pairs' quality.md already in
    --out is left as it was."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "quality.md").write_text("the committed report")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality", "--pairs", "bert", "--corpus",
         str(tmp_path / "nowhere"), "--out", str(out)], cwd=ROOT,
        env=process_env.process_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "nowhere/brown/train.txt not found" in errors[0]
    assert "python -m benchmarks.quality_bert" in errors[-1]
    assert (out / "quality.md").read_text() == "the committed report"


@pytest.mark.acceptance
def test_quick_delegated_pair_writes_its_own_report_only(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality", "--quick", "--pairs", "nnlm", "--out",
         str(out)], cwd=ROOT, env=process_env.process_env(), capture_output=True, text=True,
        timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "quality_nnlm.md").stat().st_size > 0
    assert not (out / "quality.md").exists()  # no LM pair of its own ran: no quality.md
    records = [json.loads(line) for line in (out / "quality_nnlm.jsonl").read_text().splitlines()]
    assert records[0]["mode"] == "quick" and len(records) == 2  # header + seed 0
