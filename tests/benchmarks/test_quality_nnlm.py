"""benchmarks.quality_nnlm: the examples both sides read (aligned with the id stream, never
crossing a split, each once), the peer's forward against numpy, zoo's job and the peer computing
the same loss on the same rows from the same weights, the command's user errors, and
(acceptance) a --quick run."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import quality_data, quality_nnlm
from tests import process_env

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("pad", [True, False])
def test_rows_hold_every_example_of_the_split_once_with_its_own_context(pad):
    import torch

    context, per_row = 4, 8
    stream = np.arange(1000, 1037, dtype=np.int32)  # one split: ids no other split has
    x, y = quality_nnlm.example_rows(stream, context, per_row, pad)
    assert x.shape == y.shape == (5 if pad else 4, context - 1 + per_row)
    assert (y[:, :context - 1] == -1).all()  # the leading positions only complete a context
    contexts = torch.from_numpy(x).unfold(1, context, 1).numpy()  # what the peer reads
    targets = y[:, context - 1:]
    kept = targets >= 0
    got_contexts, got_targets = contexts[kept], targets[kept]
    want_contexts, want_targets = quality_nnlm.examples(stream, context)
    n = len(want_targets) if pad else (len(want_targets) // per_row) * per_row
    # In stream order, each once: target k = stream[k + 4] after stream[k : k + 4].
    np.testing.assert_array_equal(got_targets, want_targets[:n])
    np.testing.assert_array_equal(got_contexts, want_contexts[:n])
    np.testing.assert_array_equal(want_targets, stream[context:])
    np.testing.assert_array_equal(want_contexts[5], stream[5:9])
    # Zoo's window of a weighted position p is inputs p-3..p of the row: the same context.
    r, p = np.argwhere(y >= 0)[-1]
    np.testing.assert_array_equal(x[r, p - context + 1:p + 1], got_contexts[-1])
    # Nothing from outside the split: padding is input 0 with no target.
    assert set(np.unique(x)) <= set(stream) | {0}
    assert set(np.unique(y)) <= set(stream) | {-1}


def test_row_order_is_a_seeded_permutation_per_epoch():
    order = quality_nnlm.row_order(10, 7, 3, seed=1)
    assert order.shape == (7, 3)
    flat = order.reshape(-1)
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    np.testing.assert_array_equal(order, quality_nnlm.row_order(10, 7, 3, seed=1))
    assert not np.array_equal(order, quality_nnlm.row_order(10, 7, 3, seed=2))


def _tiny_config(direct=True):
    from zoo.models import nnlm

    return nnlm.NNLMConfig(vocab_size=11, context=4, embed_dim=3, hidden_dim=5, direct=direct)


@pytest.mark.parametrize("direct", [True, False])
def test_peer_forward_is_bengios_equation_in_numpy(direct):
    import torch

    cfg = _tiny_config(direct)
    module = quality_nnlm.torch_nnlm(cfg, seed=0)
    with torch.no_grad():  # the init is tiny (C ~ 0.02): make every term count
        for p in module.parameters():
            p.normal_()
    contexts = np.array([[1, 2, 3, 4], [10, 0, 0, 7]])
    w = {k: v.detach().double().numpy() for k, v in module.state_dict().items()}
    x = w["C.weight"][contexts].reshape(2, -1)  # (N, (n-1) m), oldest word first
    want = w["U.bias"] + np.tanh(x @ w["H.weight"].T + w["H.bias"]) @ w["U.weight"].T
    if direct:
        want = want + x @ w["W.weight"].T
    got = module(torch.from_numpy(contexts)).detach().double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_peer_has_zoos_parameters_and_init_family():
    import jax

    config = quality_nnlm.job_config(quality_nnlm.QUICK, 300, seed=0)
    task = quality_nnlm.RowsNNLM(config, 300)
    cfg = task.model_config
    module = quality_nnlm.torch_nnlm(cfg, seed=0)
    zoo_count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(
        jax.eval_shape(task.init_params, jax.random.key(0))))
    peer_count = sum(p.numel() for p in module.parameters() if p.requires_grad)
    assert peer_count == zoo_count - cfg.embed_dim  # zoo's `start`, which no example reads
    assert abs(float(module.C.weight.detach().std()) - 0.02) < 0.002
    fan_in = cfg.context * cfg.embed_dim
    for layer, fan in ((module.H, fan_in), (module.U, cfg.hidden_dim), (module.W, fan_in)):
        assert abs(float(layer.weight.detach().std()) * math.sqrt(fan) - 1.0) < 0.05
    assert module.W.bias is None and float(module.U.bias.abs().sum()) == 0.0


def test_zoo_job_and_peer_compute_the_same_loss_on_the_same_rows_from_the_same_weights():
    """zoo's task loss_fn on its batch layout == the peer's loss on its contexts, zoo's weights
    copied into the peer (H and W: zoo's slots are most recent first, the peer's x oldest
    first)."""
    import jax
    import torch
    from flax import linen as nn

    config = quality_nnlm.job_config(quality_nnlm.Recipe(rows=3, per_row=5), 40, seed=0)
    task = quality_nnlm.RowsNNLM(config, 40)
    params = nn.meta.unbox(task.init_params(jax.random.key(1)))
    params = jax.tree.map(lambda p: p + 0.3 * jax.random.normal(jax.random.key(2), p.shape),
                          params)  # away from the tiny init, so a mixed-up slot shows
    stream = np.random.default_rng(0).integers(0, 40, size=30).astype(np.int32)
    x, y = quality_nnlm.example_rows(stream, config.model.context, 5, pad=True)
    x, y = x[:3], y[:3].copy()
    y[2, -2:] = -1  # padding inside a batch
    sums = task.loss_fn(params, quality_nnlm.nnlm_batch(x, y), jax.random.key(0), train=False)
    zoo_loss = float(sums["nll_sum"] / sums["weight_sum"])

    cfg = task.model_config
    module = quality_nnlm.torch_nnlm(cfg, seed=0)
    n, m = cfg.context, cfg.embed_dim
    flat = lambda k: np.asarray(k)[::-1].reshape(n * m, -1).T.copy()  # noqa: E731
    state = {"C.weight": params["C"]["embedding"], "H.weight": flat(params["H"]["kernel"]),
             "H.bias": params["H"]["bias"], "U.weight": np.asarray(params["U"]["kernel"]).T,
             "U.bias": params["U"]["bias"], "W.weight": flat(params["W"]["kernel"])}
    module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    peer = quality_nnlm.TorchRows(module, n, config.optim, eval_rows=2)
    assert abs(peer.evaluate(x, y) - zoo_loss) < 1e-5
    assert abs(float(peer._loss(x, y)) - zoo_loss) < 1e-5
    assert float(sums["weight_sum"]) == 3 * 5 - 2


def test_missing_corpus_is_one_clear_error(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    assert quality_nnlm.main(["--corpus", missing, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and missing in err and "corpus fetch brown" in err
    assert "Traceback" not in err


@pytest.mark.acceptance
def test_quick_run_learns_on_both_sides_and_they_agree(tmp_path):
    corpus = quality_data.write_fixture_corpus(str(tmp_path / "corpus"))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality_nnlm", "--quick", "--corpus", corpus,
         "--out", str(out)], cwd=ROOT, env=process_env.process_env(), capture_output=True,
        text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("quality_nnlm.jsonl", "quality_nnlm.md", "quality_nnlm-word-brown.png"):
        assert (out / name).stat().st_size > 0, name
    lines = [json.loads(line) for line in (out / "quality_nnlm.jsonl").read_text().splitlines()]
    assert lines[0]["record"] == "header" and lines[0]["mode"] == "quick"
    (r,) = lines[1:]
    uniform = math.log(r["vocab_size"])
    for split in ("validation", "test"):
        zoo, peer = (r["sides"][s]["final"][split] for s in ("zoo", "peer"))
        assert zoo < 0.5 * uniform and peer < 0.5 * uniform, (split, zoo, peer, uniform)
        assert abs(zoo - peer) < 0.05, (split, zoo, peer)  # perplexity within ~5%
    assert r["params"]["zoo"] == r["params"]["peer"] + 32  # `start`
    assert len(r["sides"]["zoo"]["step_s"]) == len(r["sides"]["peer"]["step_s"]) == 150
    assert "zoo - peer" in (out / "quality_nnlm.md").read_text()
