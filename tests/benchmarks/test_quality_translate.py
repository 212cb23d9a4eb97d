"""benchmarks.quality_translate: the PyTorch peers are zoo's models (zoo's parameters copied in,
the same logits, loss and attention maps), the peer's beam search finds what exhaustive search
finds, the attention scorers are their formulas, a missing corpus is one clear error, and
(acceptance) the --quick run of all three pairs ends with both sides trained alike."""

import itertools
import json
import math
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import quality_translate as qt
from benchmarks import quality_translate_peers
from zoo.models import encoder_decoder, seq2seq
from zoo.tasks.translation import TranslationTask

torch = pytest.importorskip("torch")

SOURCE = np.array([[5, 6, 7, 8, 2, 0, 0], [9, 10, 11, 12, 13, 14, 2]], np.int32)
TARGET_IN = np.array([[1, 20, 21, 22, 0], [1, 23, 24, 25, 26]], np.int32)
TARGET = np.array([[20, 21, 22, 2, 0], [23, 24, 25, 26, 2]], np.int32)
WEIGHTS = (TARGET != 0).astype(np.float32)


def _t(a):
    return torch.from_numpy(np.array(a, np.float32))


def transformer_to_peer(peer, params, cfg) -> None:
    """zoo's EncoderDecoder parameters into the torch.nn.Transformer peer (strict)."""
    d = cfg.hidden_size
    sd = {"embed.weight": _t(params["shared_embedding"]["embedding"])}
    for stack, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
        for i in range(n):
            z, pre = params[stack][f"layer_{i}"], f"core.{stack}.layers.{i}."
            attns = [("self_attention", "self_attn")]
            norms = [("self_attention_norm", "norm1"), ("mlp_norm", "norm2")]
            if stack == "decoder":
                attns.append(("cross_attention", "multihead_attn"))
                norms = [norms[0], ("cross_attention_norm", "norm2"), ("mlp_norm", "norm3")]
            for zn, tn in attns:
                a = z[zn]
                qkv = ("query", "key", "value")
                sd[pre + tn + ".in_proj_weight"] = torch.cat(
                    [_t(a[k]["kernel"]).reshape(d, d).T for k in qkv])
                sd[pre + tn + ".in_proj_bias"] = torch.cat([_t(a[k]["bias"]).reshape(d)
                                                            for k in qkv])
                sd[pre + tn + ".out_proj.weight"] = _t(a["out"]["kernel"]).reshape(d, d).T
                sd[pre + tn + ".out_proj.bias"] = _t(a["out"]["bias"])
            for k, name in (("wi", "linear1"), ("wo", "linear2")):
                sd[pre + name + ".weight"] = _t(z["mlp"][k]["kernel"]).T
                sd[pre + name + ".bias"] = _t(z["mlp"][k]["bias"])
            for zn, tn in norms:
                sd[pre + tn + ".weight"] = _t(z[zn]["scale"])
                sd[pre + tn + ".bias"] = _t(z[zn]["bias"])
    peer.load_state_dict(sd, strict=True)


def seq2seq_to_peer(peer, params, cfg) -> None:
    """zoo's Seq2Seq (LSTM, additive or general) parameters into the RNN peer (strict)."""
    h = cfg.hidden_size

    def cell(prefix, w):
        g = w["input_kernel"].shape[1]
        return {prefix + "weight_ih": _t(w["input_kernel"]).reshape(-1, g * h).T,
                prefix + "weight_hh": _t(w["recurrent_kernel"]).reshape(h, g * h).T,
                prefix + "bias_ih": _t(w["bias"]).reshape(-1),
                prefix + "bias_hh": torch.zeros(g * h)}

    sd = {"embed.weight": _t(params["shared_embedding"]["embedding"]),
          "output.weight": _t(params["output_projection"]["kernel"]).T,
          "output.bias": _t(params["output_projection"]["bias"])}
    for k in range(cfg.num_layers):
        w = params["encoder"][f"layer_{k}"]["cell"]
        sd.update({f"encoder.{n}_l{k}": v for n, v in
                   ((n.split(".")[-1], v) for n, v in cell("x.", w).items())})
        sd.update(cell(f"cells.{k}.", params[f"decoder_layer_{k}"]))
    for name, value in params["attention"].items():
        sd[name] = _t(value)
    peer.load_state_dict(sd, strict=True)


def _zoo_transformer(vocab=40, dropout=0.1):
    cfg = encoder_decoder.config_for_size("tiny", vocab_size=vocab, max_len=32,
                                          dropout_rate=dropout)
    model = encoder_decoder.EncoderDecoder(cfg)
    variables = model.init(jax.random.key(0), jnp.asarray(SOURCE), jnp.asarray(TARGET_IN))
    return cfg, model, flax.linen.unbox(variables["params"])


def _zoo_seq2seq(attention, vocab=40):
    cfg = seq2seq.config_for_size("tiny", vocab_size=vocab, attention=attention, embed_dim=12,
                                  hidden_size=10)
    model = seq2seq.Seq2Seq(cfg)
    variables = model.init(jax.random.key(1), jnp.asarray(SOURCE), jnp.asarray(TARGET_IN))
    params = flax.linen.unbox(variables["params"])
    # Non-zero biases, so the copy of the LSTM's one bias into bias_ih is tested too.
    params = jax.tree.map(lambda x: x + 0.05 * jnp.sin(jnp.arange(x.size).reshape(x.shape)),
                          params)
    return cfg, model, params


@pytest.mark.slow
def test_transformer_peer_is_zoos_model_same_logits_and_cross_attention():
    cfg, model, params = _zoo_transformer()
    peer = qt.torch_transformer(cfg, seed=0)
    # The peer's own init is zoo's family: every projection Glorot per d x d matrix, N(0, 1/d)
    # embeddings, zero biases, no extra final LayerNorms.
    d = cfg.hidden_size
    assert peer.core.encoder.norm is None and peer.core.decoder.norm is None
    in_proj = peer.core.encoder.layers[0].self_attn.in_proj_weight.detach()
    assert abs(float(in_proj.std()) - math.sqrt(2 / (2 * d))) < 0.01  # torch's: sqrt(2/(4d))
    assert float(peer.core.encoder.layers[0].linear1.bias.detach().abs().max()) == 0.0
    assert sum(p.numel() for p in peer.parameters()) == sum(
        x.size for x in jax.tree.leaves(params))
    transformer_to_peer(peer, params, cfg)
    peer.eval()
    with torch.no_grad():
        logits = peer(torch.from_numpy(SOURCE).long(), torch.from_numpy(TARGET_IN).long())
    expected = model.apply({"params": params}, jnp.asarray(SOURCE), jnp.asarray(TARGET_IN))
    np.testing.assert_allclose(logits.numpy(), np.asarray(expected), atol=2e-5)
    src, tgt = SOURCE[0, :5], TARGET_IN[0, :4]
    with torch.no_grad():
        peer_map = peer.cross_attention(torch.from_numpy(src[None]).long(),
                                        torch.from_numpy(tgt[None]).long()).numpy()
    np.testing.assert_allclose(peer_map, qt.zoo_cross_attention(model, params, src, tgt),
                               atol=1e-5)


@pytest.mark.parametrize("attention", ["additive", "general"])
def test_rnn_peer_is_zoos_model_same_logits_and_attention(attention):
    cfg, model, params = _zoo_seq2seq(attention)
    peer = qt.torch_seq2seq(cfg, seed=0)
    trainable = sum(p.numel() for p in peer.parameters() if p.requires_grad)
    assert trainable == sum(x.size for x in jax.tree.leaves(params))  # bias_hh frozen
    seq2seq_to_peer(peer, params, cfg)
    peer.eval()
    with torch.no_grad():
        logits, alpha = peer(torch.from_numpy(SOURCE).long(), torch.from_numpy(TARGET_IN).long(),
                             return_alpha=True)
    expected = model.apply({"params": params}, jnp.asarray(SOURCE), jnp.asarray(TARGET_IN))
    np.testing.assert_allclose(logits.numpy(), np.asarray(expected), atol=2e-5)
    np.testing.assert_allclose(alpha[0].numpy(),
                               qt.zoo_cross_attention(model, params, SOURCE[0], TARGET_IN[0]),
                               atol=1e-5)
    assert float(alpha[0, :, 5:].abs().max()) == 0.0  # padding never attended


@pytest.mark.parametrize("attention", ["additive", "general"])
def test_rnn_peer_attention_is_the_formula(attention):
    cfg, _, _ = _zoo_seq2seq(attention)
    peer = qt.torch_seq2seq(cfg, seed=3)
    rng = np.random.default_rng(0)
    b, s, h = 2, 6, cfg.hidden_size
    memory, query = rng.normal(size=(b, s, h)), rng.normal(size=(b, h))
    valid = np.array([[True] * 4 + [False] * 2, [True] * 6])
    w_q = peer.query_kernel.detach().double().numpy()
    if attention == "additive":
        w_k, v = peer.key_kernel.detach().double().numpy(), peer.v.detach().double().numpy()
        keys = memory @ w_k
        scores = np.tanh(keys + (query @ w_q)[:, None]) @ v  # v^T tanh(W_k h_s + W_q q)
    else:
        keys = memory @ w_q.T
        scores = np.einsum("bsm,hm,bh->bs", memory, w_q, query)  # h_s^T W^T q... as zoo
    scores = np.where(valid, scores, -np.inf)
    alpha = np.exp(scores - scores.max(1, keepdims=True))
    alpha /= alpha.sum(1, keepdims=True)
    with torch.no_grad():
        peer.double()
        context, got = peer.attend(torch.from_numpy(query), torch.from_numpy(keys),
                                   torch.from_numpy(memory), torch.from_numpy(valid))
    np.testing.assert_allclose(got.numpy(), alpha, atol=1e-12)
    np.testing.assert_allclose(context.numpy(), np.einsum("bs,bsm->bm", alpha, memory),
                               atol=1e-12)


class _Markov(torch.nn.Module):
    """next-token log-probabilities depend on (step, last token) only: a table."""

    def __init__(self, vocab, steps, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(steps + 1, vocab, vocab, generator=g) * 2.0

    def start(self, source_ids):
        return (torch.zeros(source_ids.shape[0]),)

    def next_logits(self, prefix, state):
        return self.table[prefix.shape[1] - 1, prefix[:, -1]], state


def _exhaustive(model, vocab, max_gen, alpha, bos, eos):
    best, best_tokens = -math.inf, None
    for length in range(1, max_gen + 1):
        for body in itertools.product([v for v in range(vocab) if v != eos], repeat=length - 1):
            tokens, logp = [bos], 0.0
            for tok in list(body) + [eos]:
                lp = torch.log_softmax(model.table[len(tokens) - 1, tokens[-1]], -1)
                logp += float(lp[tok])
                tokens.append(tok)
            score = logp / length ** alpha
            if score > best:
                best, best_tokens = score, tokens[1:]
    return best_tokens


@pytest.mark.parametrize("seed,alpha", [(0, 0.0), (1, 0.6), (2, 1.0), (3, 0.6)])
def test_peer_beam_search_with_a_wide_beam_is_exhaustive_search(seed, alpha):
    vocab, max_len, bos, eos, pad = 5, 5, 1, 2, 0
    model = _Markov(vocab, max_len, seed)
    # K >= every live prefix (4^3 = 64 at most), so no hypothesis is ever pruned.
    out = quality_translate_peers.beam_search(model, torch.zeros((1, 3), dtype=torch.long), beam_size=80,
                         max_len=max_len, alpha=alpha, ids=(bos, eos, pad))
    row = list(out[0])
    got = row[:row.index(eos) + 1]
    assert got == _exhaustive(model, vocab, max_len - 1, alpha, bos, eos)


def test_peer_beam_search_of_one_beam_is_greedy():
    vocab, max_len, bos, eos, pad = 6, 8, 1, 2, 0
    model = _Markov(vocab, max_len, 7)
    out = quality_translate_peers.beam_search(model, torch.zeros((1, 3), dtype=torch.long), beam_size=1,
                         max_len=max_len, alpha=0.0, ids=(bos, eos, pad))
    tokens = [bos]
    while len(tokens) < max_len and tokens[-1] != eos:
        tokens.append(int(model.table[len(tokens) - 1, tokens[-1]].argmax()))
    assert list(out[0][:len(tokens) - 1]) == tokens[1:]


def test_loss_and_batches_agree_between_the_sides(tmp_path):
    """The same numpy batch gives both sides the same loss (label smoothing, target weights) for
    the same parameters, and eval batches keep every row's source and target together."""
    cfg, model, params = _zoo_transformer(dropout=0.0)  # train=True then needs no rng
    peer = qt.torch_transformer(cfg, seed=0)
    transformer_to_peer(peer, params, cfg)
    peer.eval()
    batch = {"source_ids": SOURCE, "target_input_ids": TARGET_IN, "target_ids": TARGET,
             "target_weights": WEIGHTS}
    config = qt.job_config("transformer", "corpora", str(tmp_path), qt.QUICK, seed=0)
    side = qt.TorchSide(peer, config)
    task = TranslationTask.__new__(TranslationTask)
    task.config, task.model = config, model
    for smoothing in (0.0, 0.1):
        task.config.train.label_smoothing = smoothing
        sums = task.loss_fn(params, batch, jax.random.key(0), train=smoothing > 0)
        with torch.no_grad():
            total, weight = side._sums(batch, smoothing)
        key = "loss_sum" if smoothing else "nll_sum"
        assert float(weight) == float(sums["weight_sum"]) == WEIGHTS.sum()
        np.testing.assert_allclose(float(total), float(sums[key]), rtol=1e-5)
    rows = {k: np.concatenate([v, v[::-1]]) for k, v in batch.items()}
    batches = qt.eval_batches(rows, 3)
    assert [b["source_ids"].shape for b in batches] == [(3, 7), (1, 5)]  # trimmed per batch
    assert [b["target_ids"].shape for b in batches] == [(3, 5), (1, 4)]
    for key in batch:
        width = rows[key].shape[1]
        joined = np.concatenate([np.pad(b[key], ((0, 0), (0, width - b[key].shape[1])))
                                 for b in batches])
        np.testing.assert_array_equal(joined, rows[key])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["transformer", "rnn-general"])
def test_same_start_same_batches_same_training(tmp_path, model):
    """The recipe is the same on both sides: from zoo's initial parameters copied into the peer
    and without dropout, a few steps of the job's train step and of TorchSide.step on zoo's own
    batches give the same losses (the schedule, clipping, AdamW and label smoothing agree)."""
    corpus = qt.write_fixture_corpus(str(tmp_path / "corpus"))
    config = qt.job_config(model, corpus, str(tmp_path / "cache"), qt.QUICK, seed=0)
    config.model.dropout_rate = 0.0
    config.optim.warmup_steps = 2  # the learning rate at its peak within the steps run
    task = qt.make_task(config)
    zoo = qt.ZooSide(config, task)
    try:
        builder = qt.torch_transformer if model == "transformer" else qt.torch_seq2seq
        module = builder(task.model_config, seed=0)
        copy = transformer_to_peer if model == "transformer" else seq2seq_to_peer
        copy(module, flax.linen.unbox(jax.device_get(zoo.state.params)), task.model_config)
        peer = qt.TorchSide(module, config)
        batches = task.train_batches(0, 1)
        for _ in range(6):
            batch = {k: np.asarray(v) for k, v in next(batches).items() if k in qt._KEYS}
            a, b = zoo.step(dict(batch)), peer.step(dict(batch))
            np.testing.assert_allclose(a, b, rtol=2e-4)
    finally:
        zoo.close()


def test_missing_corpus_is_one_clear_error(tmp_path, capsys):
    assert qt.main(["--corpus", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(tmp_path / "bible" / "train.tsv") in err
    assert "python -m zoo.commands.corpus fetch bible --out DIR" in err


def test_fixture_corpus_has_the_bible_layout(tmp_path):
    qt.write_fixture_corpus(str(tmp_path))
    qt.check_corpus(str(tmp_path))
    for split in ("train", "validation", "test"):
        lines = (tmp_path / "bible" / f"{split}.tsv").read_text().splitlines()
        assert lines and all(len(line.split("\t")) == 2 for line in lines)


@pytest.mark.acceptance
def test_quick_run_trains_both_sides_alike(tmp_path):
    """--quick on the fixture corpus: all three pairs, one seed. Both sides learn (validation
    loss well below its start) and end near each other."""
    assert qt.main(["--quick", "--out", str(tmp_path)]) == 0
    lines = (tmp_path / "quality_translate.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines[1:]]
    assert [r["model"] for r in records] == list(qt.MODELS)
    for record in records:
        sides = record["sides"]
        assert sides["zoo"]["params"] == sides["peer"]["params"]
        for side in sides.values():
            curve = [loss for _, loss in side["curve"]]
            assert curve[0] - curve[-1] > 2.0, (record["model"], curve)
            assert len(side["samples"]) == 3 and np.isfinite(side["bleu"])
        gap = sides["zoo"]["final_val_loss"] - sides["peer"]["final_val_loss"]
        assert abs(gap) < 0.6, (record["model"], gap)
    for name in ("quality_translate.md", "quality_translate_curves.png",
                 "quality_translate_attention_transformer.png"):
        assert os.path.exists(tmp_path / name)
