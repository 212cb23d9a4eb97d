"""The translation pairs of issue 37: Spanish -> English Bible verses, zoo's translation jobs
beside a PyTorch model of the same shape, fed the same prepared batches.

    python -m benchmarks.quality_translate --corpus DIR             # full, ~20 min, 2-core CPU
    python -m benchmarks.quality_translate --quick                  # fixture corpus, ~2 min
    python -m benchmarks.quality_translate --corpus DIR --models transformer --seeds 0

Models (each a pair, two seeds by default):
  transformer   configs/translate.py:size=tiny,corpus=bible (zoo.models.encoder_decoder:
                post-norm, sinusoidal positions, one shared embedding = output projection,
                label smoothing 0.1, dropout 0.1) beside torch.nn.Transformer with the same
                settings: batch_first, norm_first as zoo's norm, LayerNorm eps 1e-6, the stacks'
                extra final LayerNorms removed for post-norm (nn.Transformer always adds them;
                zoo's post-norm stacks have none), attention-weight and feed-forward-inner
                dropout off (zoo's attention_dropout_rate and mlp_dropout_rate are 0; torch's
                layers use their one `dropout` for both), token embedding N(0, 1/d) x sqrt(d),
                the interleaved sin/cos table, logits = y E^T.
  rnn-additive  configs/rnn_translate.py:size=tiny,corpus=bible,attention=additive (Bahdanau;
  rnn-general   attention=general: Luong with input feeding) (zoo.models.seq2seq, LSTM) beside
                an nn.LSTM encoder (packed by source length, so the final states are those of the
                last real token, as zoo's) and an nn.LSTMCell decoder stack stepped in Python
                with the same attention maths.

Same init family on both sides, so the comparison is of the training: zoo's Transformer already
uses Glorot-uniform projection kernels (xavier_uniform, fan-in/out of each d x d projection) and
so does the peer, per projection (torch's default treats in_proj_weight (3d, d) as one matrix,
fan-out 3d: re-drawn per q/k/v slice here), with zero biases (torch's linear1/linear2 default to
uniform biases: zeroed). The RNN peer copies zoo.nn.recurrent_cells' families: embeddings
N(0, 0.02), input kernels lecun-normal per gate, recurrent kernels orthogonal per gate, biases 0
(the LSTM's forget gate 1; bias_hh frozen at 0, zoo's LSTM has one bias), attention kernels
lecun-normal, v N(0, 1/H), output layer lecun-normal with a zero bias.

Recipe: the job's optimizer (AdamW, betas, eps, clip, schedule of zoo.train.optim.make_schedule
read step by step on the peer's side, decay groups by zoo.train.optim.decay_mask's rule: none on
biases and LayerNorm scales; both configs have weight decay 0), with `Recipe`'s batch, steps and
warm-up: each job's schedule and peak learning rate (Transformer inverse-sqrt, 0.00625; RNN
cosine, 3e-3) with a warm-up of `Recipe.warmup` steps (configured: 400, longer than the whole
run, and 100). The data is zoo's own pipeline:
the job's task (joint BPE trained on the training verses, length buckets) yields the batches,
both sides get each batch as numpy in the same order, one step each in turns (the side going
first alternating). Validation loss: mean token NLL over the first `Recipe.eval_verses` verses of
validation.tsv (zoo's eval step; the peer the same sums). BLEU: sacrebleu corpus BLEU (zoo.eval.
bleu) of the first `Recipe.decode_verses` verses of test.tsv, beam 4, alpha 0.6 (config.eval):
zoo's own decoding (TranslationTask._decode: zoo.decoding.beam_search over the job's decoder)
and, for the peer, `beam_search` below: plain PyTorch over the peer's own model (the Transformer
re-runs its decoder over the prefix each step, no cache), with the same ranking: log P / L^alpha,
L the generated tokens with EOS, an EOS candidate kept if among the step's K best, stop once K
are finished and no live beam can beat them; both outputs cut at a * |x| + b tokens.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/quality.py

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import machine, peers, step_jobs  # noqa: E402
from zoo import errors  # noqa: E402
from zoo.data.readers import parallel  # noqa: E402
from zoo.errors import ConfigError  # noqa: E402
from zoo.eval import bleu  # noqa: E402
from zoo.train import loop, optim  # noqa: E402

MODELS = ("transformer", "rnn-additive", "rnn-general")
_KEYS = ("source_ids", "target_input_ids", "target_ids", "target_weights")
FETCH = "python -m zoo.commands.corpus fetch bible --out DIR"


# Sized for the whole run (3 models x 2 sides x 2 seeds + decoding) to fit ~20 minutes of a
# 2-core CPU shared with other jobs, where a step of either side at batch 32 measured 0.3-0.45 s:
# 200 steps of 32 verse pairs (the tutorial's tiny Transformer ran 1,500 steps of 64 to BLEU
# 22.4, so BLEU here is that of barely trained models) and a 2,000-piece BPE (the job's is
# 8,000) to cut the softmax, most of a tiny model's work.
@dataclasses.dataclass(frozen=True)
class Recipe:
    steps: int = 200
    batch: int = 32
    vocab_size: int = 2000
    warmup: int = 50  # both jobs' warm-up (configured: Transformer 400, RNN 100)
    eval_every: int = 50
    eval_verses: int = 256  # validation verses of the loss curve
    decode_verses: int = 100  # test verses translated for BLEU
    samples: int = 3


FULL = Recipe()
QUICK = Recipe(steps=50, batch=16, vocab_size=300, warmup=20, eval_every=25, eval_verses=48,
               decode_verses=16)


# ---- configs, tasks, data ---------------------------------------------------------------------

def job_config(model: str, corpus_dir: str, cache_dir: str, recipe: Recipe, seed: int
               ) -> ml_collections.ConfigDict:
    """The job's config (size tiny, corpus=bible read from corpus_dir) with the recipe's batch,
    vocabulary, steps and (Transformer) warm-up; `seed` seeds the init and the batch order."""
    from configs import rnn_translate, translate

    if model not in MODELS:
        raise ConfigError(f"--models: unknown {model!r}; choose from {MODELS}")
    if model == "transformer":
        config = translate.get_config(f"size=tiny,corpus=bible,corpus_dir={corpus_dir}")
    else:
        attention = model.split("-")[1]
        config = rnn_translate.get_config(
            f"size=tiny,corpus=bible,corpus_dir={corpus_dir},attention={attention}")
    # A shorter warm-up; the job's peak learning rate kept (Transformer d^-0.5 400^-0.5).
    config.optim.warmup_steps = recipe.warmup
    config.data.update(batch_size=recipe.batch, vocab_size=recipe.vocab_size,
                       cache_dir=cache_dir, seed=seed)
    config.train.update(steps=recipe.steps, seed=seed)  # optim.total_steps follows
    return config


def check_corpus(corpus_dir: str) -> None:
    for name in ("train.tsv", "validation.tsv", "test.tsv"):
        path = os.path.join(corpus_dir, "bible", name)
        if not os.path.isfile(path):
            raise ConfigError(f"--corpus: {path} is missing; fetch the corpus with `{FETCH}` "
                              "and pass --corpus DIR (or --quick for a fixture corpus)")


def make_task(config: ml_collections.ConfigDict):
    from zoo.tasks.rnn_translation import RNNTranslationTask
    from zoo.tasks.translation import TranslationTask

    cls = TranslationTask if config.task == "translate" else RNNTranslationTask
    return cls(config, workdir=config.data.cache_dir)


def rows_of(task, pairs: list[tuple[str, str]]) -> dict[str, np.ndarray]:
    data = task.config.data
    return parallel.encode_pairs(pairs, task.tokenizer, data.source_len, data.target_len)


def trim(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows cut to the longest real source / target of the batch (eval batches: one pass)."""
    s = max(int((batch["source_ids"] != 0).sum(1).max()), 1)
    t = max(int(batch["target_weights"].sum(1).max()), 1)
    return {"source_ids": batch["source_ids"][:, :s],
            **{k: batch[k][:, :t] for k in _KEYS[1:]}}


def eval_batches(rows: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
    return [trim({k: rows[k][i:i + size] for k in _KEYS}) for i in range(0, len(rows[_KEYS[0]]),
                                                                          size)]


# ---- zoo's side --------------------------------------------------------------------------------

class ZooSide:
    """The job's task, optimizer and zoo.train.loop's jitted train / eval steps (one device)."""

    name = "zoo"

    def __init__(self, config: ml_collections.ConfigDict, task):
        self.config, self.task = config, task
        self.setup = step_jobs.build(config, task)
        self.train_step = loop.make_train_step(self.setup, config)
        self.eval_step = loop.make_eval_step(self.setup)
        self.state = self.setup.state
        self._context = contextlib.ExitStack()
        self._context.enter_context(jax.set_mesh(self.setup.mesh))
        self._context.enter_context(nn.logical_axis_rules(self.setup.rules))
        # One jitted decoder per task, so a second seed on the same task compiles nothing.
        if "_jit_decode" not in task.__dict__:
            task._jit_decode = jax.jit(task._decode)
        self._decode = task._jit_decode

    def close(self):
        self._context.close()

    def num_params(self) -> int:
        return int(sum(np.prod(p.shape) for p in jax.tree.leaves(self.state.params)))

    def step(self, batch: dict[str, np.ndarray]) -> float:
        self.state, metrics = self.train_step(
            self.state, jax.device_put(batch, self.setup.batch_sharding))
        return float(metrics["loss_sum"] / metrics["weight_sum"])

    def evaluate(self, batches: list[dict[str, np.ndarray]]) -> float:
        nll = weight = 0.0
        for batch in batches:
            sums = jax.device_get(self.eval_step(
                self.state.params, jax.device_put(batch, self.setup.batch_sharding)))
            nll, weight = nll + float(sums["nll_sum"]), weight + float(sums["weight_sum"])
        return nll / weight

    def translate(self, source_ids: np.ndarray) -> np.ndarray:
        """Token rows (no BOS; EOS then pad) by the job's own decoding (config.eval: beam)."""
        return np.asarray(self._decode(self.state.params, jnp.asarray(source_ids)))

    def cross_attention(self, source_ids: np.ndarray, target_input_ids: np.ndarray) -> np.ndarray:
        return zoo_cross_attention(self.task.model, self.state.params, source_ids,
                                   target_input_ids)


def zoo_cross_attention(model, params, source_ids: np.ndarray, target_input_ids: np.ndarray
                        ) -> np.ndarray:
    """[T, S] cross-attention of one teacher-forced pair, sown by zoo's model (Transformer: the
    last layer's, averaged over heads; RNN: alpha)."""
    from zoo.models import encoder_decoder, seq2seq

    _, state = model.apply({"params": params}, jnp.asarray(source_ids[None]),
                           jnp.asarray(target_input_ids[None]), sow_weights=True,
                           mutable=["intermediates"])
    if isinstance(model, encoder_decoder.EncoderDecoder):
        maps = encoder_decoder.attention_weights(state["intermediates"])["cross"]
        return np.asarray(maps[-1, 0].mean(axis=0))  # (T, S)
    return np.asarray(seq2seq.attention_weights(state["intermediates"])[0])


# ---- the PyTorch peers -------------------------------------------------------------------------

def _lecun_normal_(weight, fan_in: int):
    """flax lecun_normal: a +-2 sd truncated normal rescaled to variance 1 / fan_in."""
    import torch

    std = (1.0 / fan_in) ** 0.5 / 0.87962566103423978
    torch.nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


def sinusoids(length: int, d: int):
    """The paper's table with sines and cosines interleaved (P[i, 2j] sin, P[i, 2j + 1] cos)."""
    import torch

    inv = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv  # (L, d/2)
    return torch.stack([angles.sin(), angles.cos()], -1).reshape(length, -1)[:, :d].float()


def torch_transformer(cfg, seed: int):
    """torch.nn.Transformer of zoo's TransformerConfig `cfg` (see the module docstring)."""
    import torch

    if cfg.share_embeddings != "all" or cfg.positions != "sinusoidal":
        raise ConfigError("the Transformer peer is written for share_embeddings='all' and "
                          "sinusoidal positions (configs/translate.py's defaults)")
    torch.manual_seed(seed)
    d = cfg.hidden_size

    class Peer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(cfg.vocab_size, d)
            self.core = torch.nn.Transformer(
                d_model=d, nhead=cfg.num_heads, num_encoder_layers=cfg.num_encoder_layers,
                num_decoder_layers=cfg.num_decoder_layers, dim_feedforward=cfg.mlp_dim,
                dropout=cfg.dropout_rate, activation=cfg.activation, batch_first=True,
                norm_first=cfg.norm_position == "pre", layer_norm_eps=cfg.layer_norm_epsilon)
            if cfg.norm_position == "post":  # zoo's post-norm stacks end on the last sublayer's
                self.core.encoder.norm = None
                self.core.decoder.norm = None
            self.drop = torch.nn.Dropout(cfg.dropout_rate)
            self.register_buffer("positions", sinusoids(cfg.max_len, d), persistent=False)
            layers = list(self.core.encoder.layers) + list(self.core.decoder.layers)
            with torch.no_grad():
                torch.nn.init.normal_(self.embed.weight, std=d ** -0.5)
                for layer in layers:
                    layer.dropout = torch.nn.Identity()  # the feed-forward's inner dropout
                    attns = [layer.self_attn] + ([layer.multihead_attn]
                                                  if hasattr(layer, "multihead_attn") else [])
                    for attn in attns:
                        attn.dropout = cfg.attention_dropout_rate
                        for k in range(3):  # q, k, v: each its own d x d Glorot matrix
                            torch.nn.init.xavier_uniform_(attn.in_proj_weight[k * d:(k + 1) * d])
                        attn.in_proj_bias.zero_()
                        torch.nn.init.xavier_uniform_(attn.out_proj.weight)
                        attn.out_proj.bias.zero_()
                    for linear in (layer.linear1, layer.linear2):
                        torch.nn.init.xavier_uniform_(linear.weight)
                        linear.bias.zero_()

        def _embed(self, ids):
            x = self.embed(ids) * math.sqrt(d) + self.positions[:ids.shape[1]]
            return self.drop(x)

        def encode(self, source_ids):
            pad = source_ids == cfg.pad_id  # (B, S) True = masked
            return self.core.encoder(self._embed(source_ids), src_key_padding_mask=pad), pad

        def decode(self, target_input_ids, memory, pad):
            t = target_input_ids.shape[1]
            causal = torch.nn.Transformer.generate_square_subsequent_mask(t)
            y = self.core.decoder(self._embed(target_input_ids), memory, tgt_mask=causal,
                                  tgt_is_causal=True, memory_key_padding_mask=pad)
            return y @ self.embed.weight.T  # (B, T, V), the tied projection

        def forward(self, source_ids, target_input_ids):
            memory, pad = self.encode(source_ids)
            return self.decode(target_input_ids, memory, pad)

        # decoding: the state is (memory, pad); each step re-runs the decoder over the prefix
        def start(self, source_ids):
            return self.encode(source_ids)

        def next_logits(self, prefix, state):
            return self.decode(prefix, *state)[:, -1], state

        def cross_attention(self, source_ids, target_input_ids):
            """[T, S]: the last decoder layer's cross-attention, averaged over heads."""
            seen = {}
            attn = self.core.decoder.layers[-1].multihead_attn

            def pre(module, args, kwargs):
                kwargs.update(need_weights=True, average_attn_weights=True)
                return args, kwargs

            def post(module, args, output):
                seen["w"] = output[1]

            hooks = [attn.register_forward_pre_hook(pre, with_kwargs=True),
                     attn.register_forward_hook(post)]
            try:
                self(source_ids, target_input_ids)
            finally:
                for h in hooks:
                    h.remove()
            return seen["w"][0]

    return Peer()


def _init_cell_(w_ih, w_hh, b_ih, b_hh, cell: str, h: int):
    """zoo.nn.recurrent_cells' init on one torch LSTM/GRU layer's weights (gates stacked)."""
    import torch

    gates = {"lstm": 4, "gru": 3}[cell]
    for g in range(gates):
        _lecun_normal_(w_ih[g * h:(g + 1) * h], w_ih.shape[1])
        torch.nn.init.orthogonal_(w_hh[g * h:(g + 1) * h])
    b_ih.zero_()
    b_hh.zero_()
    if cell == "lstm":
        b_ih[h:2 * h] = 1.0  # the forget gate (i, f, g, o)
        b_hh.requires_grad_(False)  # zoo's LSTM has one bias: b_ih + b_hh


def torch_seq2seq(cfg, seed: int):
    """An nn.LSTM / nn.GRU encoder-decoder with Bahdanau or Luong-general attention equal to
    zoo's Seq2Seq of `cfg` (Seq2SeqConfig) in shape and init family."""
    import torch

    if cfg.attention not in ("additive", "general") or cfg.bidirectional or \
            cfg.cell not in ("lstm", "gru") or not cfg.share_embeddings:
        raise ConfigError("the RNN peer is written for a unidirectional LSTM/GRU with additive "
                          "or general attention and one shared embedding")
    torch.manual_seed(seed)
    e, h, n = cfg.embed_dim, cfg.hidden_size, cfg.num_layers
    lstm = cfg.cell == "lstm"
    rnn_cls = torch.nn.LSTM if lstm else torch.nn.GRU
    cell_cls = torch.nn.LSTMCell if lstm else torch.nn.GRUCell

    class Peer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(cfg.vocab_size, e)
            self.encoder = rnn_cls(e, h, n, batch_first=True, dropout=cfg.dropout_rate)
            extra = h  # additive: the context (M = H); general: the fed-back h~
            self.cells = torch.nn.ModuleList(
                [cell_cls(e + extra if k == 0 else h, h) for k in range(n)])
            if cfg.attention == "additive":
                self.key_kernel = torch.nn.Parameter(torch.empty(h, h))  # W_k (M, H)
                self.query_kernel = torch.nn.Parameter(torch.empty(h, h))  # W_q (H, H)
                self.v = torch.nn.Parameter(torch.randn(h) * h ** -0.5)
            else:
                self.query_kernel = torch.nn.Parameter(torch.empty(h, h))  # W (H, M)
                self.output_kernel = torch.nn.Parameter(torch.empty(2 * h, h))  # W_c (M+H, H)
            self.output = torch.nn.Linear(h, cfg.vocab_size)
            self.drop = torch.nn.Dropout(cfg.dropout_rate)
            with torch.no_grad():
                torch.nn.init.normal_(self.embed.weight, std=0.02)
                for k in range(n):
                    _init_cell_(*(getattr(self.encoder, f"{p}_l{k}") for p in
                                  ("weight_ih", "weight_hh", "bias_ih", "bias_hh")), cfg.cell, h)
                    c = self.cells[k]
                    _init_cell_(c.weight_ih, c.weight_hh, c.bias_ih, c.bias_hh, cfg.cell, h)
                for name in ("key_kernel", "query_kernel", "output_kernel"):
                    if hasattr(self, name):
                        w = getattr(self, name)
                        _lecun_normal_(w, w.shape[0])
                _lecun_normal_(self.output.weight, h)
                self.output.bias.zero_()

        def start(self, source_ids):
            """(carries per layer, memory (B, S, H), keys (B, S, H), valid (B, S), feed)."""
            valid = source_ids != cfg.pad_id
            lengths = valid.sum(1).clamp(min=1)
            x = self.drop(self.embed(source_ids))
            packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True,
                                                             enforce_sorted=False)
            out, final = self.encoder(packed)
            memory, _ = torch.nn.utils.rnn.pad_packed_sequence(
                out, batch_first=True, total_length=source_ids.shape[1])  # 0 at padding
            if lstm:
                carries = [(final[1][k], final[0][k]) for k in range(n)]  # (c, h) as zoo
            else:
                carries = [final[k] for k in range(n)]
            if cfg.attention == "additive":
                keys = memory @ self.key_kernel  # W_k h_s
            else:
                keys = memory @ self.query_kernel.T  # W^T h_s: h_s^T W q = (W^T h_s) . q
            feed = memory.new_zeros(source_ids.shape[0], h)
            return carries, memory, keys, valid, feed

        def attend(self, query, keys, memory, valid):
            if cfg.attention == "additive":
                hidden = torch.tanh(keys + (query @ self.query_kernel)[:, None])  # (B, S, H)
                scores = hidden @ self.v
            else:
                scores = torch.einsum("bsh,bh->bs", keys, query)
            alpha = scores.masked_fill(~valid, float("-inf")).softmax(-1)  # (B, S)
            return torch.einsum("bs,bsm->bm", alpha, memory), alpha

        def step(self, y_t, state):
            """One target position: embedded y_{t-1} (B, E) -> (output (B, H), alpha, state)."""
            carries, memory, keys, valid, feed = state
            top = carries[-1][1] if lstm else carries[-1]
            if cfg.attention == "additive":
                context, alpha = self.attend(top, keys, memory, valid)  # s_{t-1} queries
                x = torch.cat([y_t, context], -1)
            else:
                x = torch.cat([y_t, feed], -1)  # input feeding
            new = []
            for k, cell in enumerate(self.cells):
                if k:
                    x = self.drop(x)
                if lstm:
                    c_prev, h_prev = carries[k]
                    h_new, c_new = cell(x, (h_prev, c_prev))
                    new.append((c_new, h_new))
                else:
                    h_new = cell(x, carries[k])
                    new.append(h_new)
                x = h_new
            out = x
            if cfg.attention == "general":
                context, alpha = self.attend(x, keys, memory, valid)  # h_t queries
                out = feed = torch.tanh(torch.cat([context, x], -1) @ self.output_kernel)
            return out, alpha, (new, memory, keys, valid, feed)

        def forward(self, source_ids, target_input_ids, return_alpha=False):
            state = self.start(source_ids)
            ys = self.drop(self.embed(target_input_ids))  # (B, T, E)
            outs, alphas = [], []
            for t in range(ys.shape[1]):
                out, alpha, state = self.step(ys[:, t], state)
                outs.append(out)
                alphas.append(alpha)
            logits = self.output(self.drop(torch.stack(outs, 1)))  # (B, T, V)
            return (logits, torch.stack(alphas, 1)) if return_alpha else logits

        def next_logits(self, prefix, state):
            out, _, state = self.step(self.embed(prefix[:, -1]), state)
            return self.output(out), state

        def cross_attention(self, source_ids, target_input_ids):
            return self(source_ids, target_input_ids, return_alpha=True)[1][0]

    return Peer()


class TorchSide:
    """The peer trained with the job's recipe: zero_grad, label-smoothed token cross-entropy
    over the target weights, backward, clip_grad_norm_, AdamW with the schedule of
    zoo.train.optim.make_schedule set before each step."""

    name = "peer"

    def __init__(self, module, config: ml_collections.ConfigDict):
        import torch

        self.torch, self.module, self.config = torch, module, config
        self.schedule = optim.make_schedule(config.optim)
        named = [(k, p) for k, p in module.named_parameters() if p.requires_grad]
        # zoo.train.optim.decay_mask's rule: no decay on biases and LayerNorm scales.
        no_decay = lambda k, p: k.endswith("bias") or (p.dim() == 1)  # noqa: E731
        o = config.optim
        self.optimizer = torch.optim.AdamW(
            [{"params": [p for k, p in named if not no_decay(k, p)], "weight_decay":
              o.weight_decay},
             {"params": [p for k, p in named if no_decay(k, p)], "weight_decay": 0.0}],
            lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
        self.trainable = [p for _, p in named]
        self.steps = 0
        self.smoothing = float(config.train.label_smoothing)

    def close(self):
        pass

    def num_params(self) -> int:
        return sum(p.numel() for p in self.trainable)

    def _sums(self, batch, smoothing: float):
        torch = self.torch
        b = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
        logits = self.module(b["source_ids"].long(), b["target_input_ids"].long())
        v = logits.shape[-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, v), b["target_ids"].long().reshape(-1), reduction="none",
            label_smoothing=smoothing)
        w = b["target_weights"].reshape(-1).float()
        return (loss * w).sum(), w.sum()

    def step(self, batch: dict[str, np.ndarray]) -> float:
        lr = float(self.schedule(self.steps))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        total, weight = self._sums(batch, self.smoothing)
        loss = total / weight
        loss.backward()
        if self.config.optim.clip_norm:
            self.torch.nn.utils.clip_grad_norm_(self.trainable, self.config.optim.clip_norm)
        self.optimizer.step()
        self.steps += 1
        return float(loss.item())

    def evaluate(self, batches: list[dict[str, np.ndarray]]) -> float:
        self.module.eval()
        nll = weight = 0.0
        with self.torch.no_grad():
            for batch in batches:
                s, w = self._sums(batch, 0.0)
                nll, weight = nll + float(s), weight + float(w)
        return nll / weight

    def translate(self, source_ids: np.ndarray) -> np.ndarray:
        ev, cfg = self.config.eval, self.config.data
        self.module.eval()
        with self.torch.no_grad():
            src = self.torch.from_numpy(np.ascontiguousarray(source_ids)).long()
            return beam_search(self.module, src, beam_size=ev.beam_size,
                               max_len=cfg.target_len + 1, alpha=ev.alpha, ids=_ids(self))

    def cross_attention(self, source_ids, target_input_ids) -> np.ndarray:
        self.module.eval()
        with self.torch.no_grad():
            t = lambda a: self.torch.from_numpy(np.ascontiguousarray(a[None])).long()  # noqa
            return self.module.cross_attention(t(source_ids), t(target_input_ids)).numpy()


def _ids(side) -> tuple[int, int, int]:
    tok = side.tokenizer
    return tok.bos_id, tok.eos_id, tok.pad_id


def _gather(state, rows):
    if isinstance(state, (tuple, list)):
        return type(state)(_gather(s, rows) for s in state)
    return state.index_select(0, rows)


def beam_search(model, source_ids, *, beam_size: int, max_len: int, alpha: float,
                ids: tuple[int, int, int]) -> np.ndarray:
    """Beam search in plain PyTorch over `model.start(source_ids)` and
    `model.next_logits(prefix (N, t), state) -> (logits (N, V), state)`.

    Hypotheses rank by log P / L^alpha, L the generated tokens with EOS. Each step expands the
    K live beams by every token; a beam + EOS joins the row's K finished hypotheses if it is
    among the step's K best candidates, the K best others live on. A row stops once it holds K
    finished hypotheses and its best live beam, even ended at the longest length allowed
    (max_len - 1 tokens), could not beat the worst of them. Returns [B, max_len - 1] tokens:
    the best hypothesis (a row that finished none: its best live beam), EOS, then pad.
    """
    import torch

    bos, eos, pad = ids
    b, k = source_ids.shape[0], beam_size
    state = _gather(model.start(source_ids), torch.arange(b).repeat_interleave(k))
    seqs = torch.full((b * k, 1), bos, dtype=torch.long)
    live = torch.full((b, k), float("-inf"))
    live[:, 0] = 0.0
    pools: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    done = [False] * b
    max_gen = max_len - 1
    for t in range(max_gen):
        logits, state = model.next_logits(seqs, state)
        logp = torch.log_softmax(logits.float(), -1)
        v = logp.shape[-1]
        cand = live[:, :, None] + logp.view(b, k, v)  # (B, K, V)
        kth = cand.view(b, -1).topk(k).values[:, -1]  # (B,)
        eos_lp = cand[:, :, eos]
        for r in range(b):
            if done[r]:
                continue
            for j in range(k):
                lp = float(eos_lp[r, j])
                if lp > float("-inf") and lp >= float(kth[r]):
                    pools[r].append((lp / (t + 1) ** alpha,
                                     seqs[r * k + j, 1:].tolist() + [eos]))
            pools[r] = sorted(pools[r], key=lambda item: -item[0])[:k]
        cand[:, :, eos] = float("-inf")
        live, flat = cand.view(b, -1).topk(k)
        parent, token = flat // v, flat % v
        rows = (torch.arange(b)[:, None] * k + parent).view(-1)
        seqs = torch.cat([seqs.index_select(0, rows), token.view(-1, 1)], 1)
        state = _gather(state, rows)
        for r in range(b):
            best_to_come = float(live[r, 0]) / max_gen ** alpha
            if len(pools[r]) == k and pools[r][-1][0] >= best_to_come or \
                    bool(torch.isinf(live[r]).all()):
                done[r] = True
        if all(done):
            break
    out = np.full((b, max_gen), pad, np.int32)
    for r in range(b):
        tokens = pools[r][0][1] if pools[r] else seqs[r * k, 1:].tolist()
        out[r, :len(tokens)] = tokens[:max_gen]
    return out


# ---- one pair ----------------------------------------------------------------------------------

def texts(task, tokens: np.ndarray, source_lengths: np.ndarray) -> list[str]:
    """Detokenized hypotheses cut at EOS and at a * |x| + b tokens (the task's own rule)."""
    return task._texts(tokens, source_lengths)


def run_pair(model: str, corpus_dir: str, cache_dir: str, recipe: Recipe, seed: int,
             log: Callable[[str], None] = print, task=None) -> dict[str, Any]:
    """One seed of one model's pair: both sides trained in turns on zoo's batches, then the
    validation loss, BLEU on the test verses, samples and one attention map each. `task`: the
    job's task made for another seed of the same model (its tokenizer, rows and compiled
    decoder reused; its config replaced by this seed's)."""
    config = job_config(model, corpus_dir, cache_dir, recipe, seed)
    if task is None:
        task = make_task(config)
    task.config = config  # the seed's init and batch order; data and model are the same
    test_pairs = parallel.read_parallel(os.path.join(corpus_dir, "bible", "test.tsv"))
    test_pairs = test_pairs[:recipe.decode_verses]
    test = rows_of(task, test_pairs)
    val = {k: v[:recipe.eval_verses] for k, v in task.eval_rows.items()}
    val_batches = eval_batches(val, 64)
    zoo = ZooSide(config, task)
    builder = torch_transformer if model == "transformer" else torch_seq2seq
    peer = TorchSide(builder(task.model_config, seed), config)
    peer.tokenizer = task.tokenizer
    sides = [zoo, peer]
    out = {s.name: {"train_loss": [], "step_s": [], "curve": []} for s in sides}

    def evaluate(step: int):
        for side in sides:
            start = time.perf_counter()
            loss = side.evaluate(val_batches)
            out[side.name]["curve"].append((step, loss))
            log(f"  {model} seed {seed} step {step:4d} {side.name:4s} val loss {loss:.4f} "
                f"({time.perf_counter() - start:.1f} s)")

    try:
        evaluate(0)
        batches = task.train_batches(0, 1)
        for i in range(recipe.steps):
            batch = {k: np.asarray(v) for k, v in next(batches).items() if k in _KEYS}
            for side in (sides if i % 2 == 0 else sides[::-1]):
                copy = {k: v.copy() for k, v in batch.items()}  # neither side can change it
                start = time.perf_counter()
                loss = side.step(copy)
                out[side.name]["step_s"].append(time.perf_counter() - start)
                out[side.name]["train_loss"].append(loss)
            if (i + 1) % recipe.eval_every == 0 or i + 1 == recipe.steps:
                evaluate(i + 1)
        references = [target for _, target in test_pairs]
        shown = 0  # the attention map's verse: the first test verse of 12-30 source tokens
        lengths = test["source_lengths"]
        fits = np.flatnonzero((lengths >= 12) & (lengths <= 30))
        shown = int(fits[0]) if len(fits) else 0
        for side in sides:
            start = time.perf_counter()
            tokens = np.concatenate([side.translate(test["source_ids"][i:i + 50])
                                     for i in range(0, len(references), 50)])
            hyps = texts(task, tokens, test["source_lengths"])
            score = bleu.corpus_bleu(hyps, [references])
            n = int(test["target_lengths"][shown])
            attention = side.cross_attention(test["source_ids"][shown, :lengths[shown]],
                                             test["target_input_ids"][shown, :n])
            out[side.name].update(
                bleu=score.score, bleu_signature=score.signature,
                decode_s=time.perf_counter() - start, samples=hyps[:recipe.samples],
                attention=np.asarray(attention, np.float32).round(4).tolist(),
                params=side.num_params(), final_val_loss=out[side.name]["curve"][-1][1])
            log(f"  {model} seed {seed} {side.name:4s} BLEU {score.score:.2f} "
                f"({time.perf_counter() - start:.1f} s)")
    finally:
        zoo.close()
    pieces = lambda ids: [task.tokenizer.decode([int(i)]) for i in ids]  # noqa: E731
    n = int(test["target_lengths"][shown])
    return {"task": task, "pair": f"{model}-bible-es-en", "model": model, "seed": seed,
            "recipe": dataclasses.asdict(recipe), "vocab_size": task.tokenizer.vocab_size,
            "train_pairs": int(len(task.train_rows["source_ids"])),
            "sources": [s for s, _ in test_pairs[:recipe.samples]],
            "references": references[:recipe.samples],
            "attention_verse": {"source": pieces(test["source_ids"][shown, :lengths[shown]]),
                                "target": pieces(test["target_ids"][shown, :n])},
            "sides": out}


# ---- fixture, report ---------------------------------------------------------------------------

_ES_EN = [("el hombre", "the man"), ("la mujer", "the woman"), ("el rey", "the king"),
          ("el pueblo", "the people"), ("el profeta", "the prophet"), ("la ciudad", "the city"),
          ("el siervo", "the servant"), ("el hijo", "the son")]
_VERBS = [("habló a", "spoke to"), ("vio a", "saw"), ("bendijo a", "blessed"),
          ("siguió a", "followed"), ("llamó a", "called")]
_TAILS = [("", ""), (" en la tierra", " in the land"), (" en el templo", " in the temple"),
          (" por la mañana", " in the morning")]


def write_fixture_corpus(corpus_dir: str, seed: int = 0) -> str:
    """bible/{train,validation,test}.tsv of short templated Spanish<TAB>English verses, the
    layout `python -m zoo.commands.corpus fetch bible` writes; returns corpus_dir."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(corpus_dir, "bible"), exist_ok=True)
    for split, count in (("train", 1200), ("validation", 60), ("test", 60)):
        lines = []
        for _ in range(count):
            (s1, e1), (v1, ve), (s2, e2), (t1, te) = (
                _ES_EN[rng.integers(len(_ES_EN))], _VERBS[rng.integers(len(_VERBS))],
                _ES_EN[rng.integers(len(_ES_EN))], _TAILS[rng.integers(len(_TAILS))])
            o2 = s2.replace("a el ", "al ")
            lines.append(f"{s1.capitalize()} {v1} {o2}{t1}.\t{e1.capitalize()} {ve} {e2}{te}.")
        with open(os.path.join(corpus_dir, "bible", f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return corpus_dir


def median_ms(seconds: list[float]) -> float:
    """Median step time, the first 10% (the compiles of each length bucket) left out."""
    return 1000.0 * float(np.median(seconds[max(1, len(seconds) // 10):]))


def summarize(record: dict) -> dict:
    z, p = record["sides"]["zoo"], record["sides"]["peer"]
    return {"model": record["model"], "seed": record["seed"],
            "val_loss": {"zoo": z["final_val_loss"], "peer": p["final_val_loss"]},
            "bleu": {"zoo": z["bleu"], "peer": p["bleu"]},
            "ms_per_step": {"zoo": median_ms(z["step_s"]), "peer": median_ms(p["step_s"])},
            "params": {"zoo": z["params"], "peer": p["params"]}}


def write_report(directory: str, header: dict, records: list[dict]) -> list[str]:
    """quality_translate.{jsonl,md}, quality_translate_curves.png and one
    quality_translate_attention_<model>.png per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = os.path.join(directory, "quality_translate")
    with open(base + ".jsonl", "w") as f:
        f.write(json.dumps(header) + "\n")
        for record in records:
            f.write(json.dumps(dict(record, summary=summarize(record))) + "\n")
    models = list(dict.fromkeys(r["model"] for r in records))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        for record in (r for r in records if r["model"] == model):
            for side, style in (("zoo", "-"), ("peer", "--")):
                steps, losses = zip(*record["sides"][side]["curve"])
                ax.plot(steps, losses, style, label=f"{side} seed {record['seed']}")
        ax.set(title=model, xlabel="step", ylabel="validation loss (nats/token)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [base + ".jsonl", base + ".md", base + "_curves.png"]
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    for model in models:
        record = next(r for r in records if r["model"] == model)
        verse = record["attention_verse"]
        fig, axes = plt.subplots(1, 2, figsize=(13, 6.5))
        for ax, side in zip(axes, ("zoo", "peer")):
            ax.imshow(np.asarray(record["sides"][side]["attention"]), cmap="viridis",
                      aspect="auto", vmin=0.0)
            ax.set_xticks(range(len(verse["source"])), verse["source"], rotation=90, fontsize=6)
            ax.set_yticks(range(len(verse["target"])), verse["target"], fontsize=6)
            ax.set_title(f"{side}: {model} seed {record['seed']} cross-attention"
                         + (" (last layer, mean of heads)" if model == "transformer" else ""),
                         fontsize=8)
        fig.tight_layout()
        paths.append(f"{base}_attention_{model}.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    with open(base + ".md", "w") as f:
        f.write(markdown(header, records))
    return paths


def markdown(header: dict, records: list[dict]) -> str:
    lines = ["# Translation pairs: zoo beside PyTorch, Spanish -> English Bible (issue 37)", "",
             f"Machine {header['machine']}, zoo {header['zoo_commit']}, jax {header['jax']}, "
             f"torch {header['torch']} ({header['threads']} threads), {header['mode']} run "
             f"started {header['started']}, {header['wall_s'] / 60:.1f} min.", "",
             f"Recipe: {json.dumps(header['recipe'])}.", "",
             "Validation loss: mean token NLL, first eval_verses verses of validation.tsv. "
             "BLEU: sacrebleu corpus BLEU of the first decode_verses verses of test.tsv, beam 4, "
             "alpha 0.6. ms/step: median (first 10% of steps left out), measured in turns.", "",
             "| model | seed | val loss zoo | val loss peer | BLEU zoo | BLEU peer | "
             "ms/step zoo | ms/step peer | params zoo / peer |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in map(summarize, records):
        lines.append(
            f"| {s['model']} | {s['seed']} | {s['val_loss']['zoo']:.3f} | "
            f"{s['val_loss']['peer']:.3f} | {s['bleu']['zoo']:.2f} | {s['bleu']['peer']:.2f} | "
            f"{s['ms_per_step']['zoo']:.0f} | {s['ms_per_step']['peer']:.0f} | "
            f"{s['params']['zoo']:,} / {s['params']['peer']:,} |")
    lines += ["", "## Goals (mean over seeds)", ""]
    for model in dict.fromkeys(r["model"] for r in records):
        ss = [summarize(r) for r in records if r["model"] == model]
        mean = lambda key, side: float(np.mean([s[key][side] for s in ss]))  # noqa: E731
        bleu_gap = mean("bleu", "zoo") - mean("bleu", "peer")
        loss_gap = mean("val_loss", "zoo") - mean("val_loss", "peer")
        spread = max(max(s["val_loss"][k] for s in ss) - min(s["val_loss"][k] for s in ss)
                     for k in ("zoo", "peer"))
        ratio = mean("ms_per_step", "zoo") / mean("ms_per_step", "peer")
        lines.append(
            f"- {model}: BLEU zoo - peer {bleu_gap:+.2f} "
            f"({'met' if bleu_gap > -1.0 else 'NOT met'}: within 1 of the peer or above); "
            f"val loss zoo - peer {loss_gap:+.3f} (seed spread {spread:.3f}); "
            f"time per step zoo / peer {ratio:.2f} ({'met' if ratio <= 1.0 else 'NOT met'}).")
    lines += ["", "## Samples (seed of the first record per model)", ""]
    for model in dict.fromkeys(r["model"] for r in records):
        record = next(r for r in records if r["model"] == model)
        lines.append(f"### {model}")
        for k, (src, ref) in enumerate(zip(record["sources"], record["references"])):
            lines += ["", f"- source: {src}", f"  - reference: {ref}",
                      f"  - zoo: {record['sides']['zoo']['samples'][k]}",
                      f"  - peer: {record['sides']['peer']['samples'][k]}"]
        lines.append("")
    lines += ["Plots: quality_translate_curves.png (validation loss), "
              "quality_translate_attention_<model>.png (one test verse's cross-attention, zoo "
              "left, peer right).", ""]
    lines += [f"- {note}" for note in header["notes"]]
    return "\n".join(lines) + "\n"


NOTES = [
    "Both sides: the job's own batches (its task's tokenizer, encoding and length-bucketed "
    "iterator, data.seed = the seed), as numpy, the same order, one step each in turns.",
    "Init family: Glorot-uniform per projection and N(0, 1/d) embeddings (Transformer); "
    "lecun-normal / orthogonal per gate (RNN), as zoo's; the peer's torch defaults re-drawn.",
    "nn.Transformer's extra final encoder/decoder LayerNorms removed (zoo's post-norm stacks "
    "have none); its attention-weight and feed-forward-inner dropout off, as zoo's.",
    "The peer's beam search re-runs its decoder over the whole prefix each step (no cache).",
]


# ---- entry points ------------------------------------------------------------------------------

def run(corpus_dir: str, models=MODELS, seeds=(0, 1), recipe: Recipe = FULL, out: str = "",
        cache_dir: str = "", mode: str = "full", log=print) -> list[dict]:
    """Every model's pair for every seed; writes the report into results_dir(out) and returns
    the records."""
    check_corpus(corpus_dir)
    reason = peers.unavailable_reason(jax.devices()[0].platform)
    if reason:
        raise ConfigError(f"benchmarks.quality_translate needs its PyTorch peer: {reason}")
    directory = machine.results_dir(out or None)
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "zoo_quality_translate")
    torch_info = peers.setup_torch("cpu")
    started, start = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    records = []
    for model in models:
        task = None
        for seed in seeds:
            log(f"{model} seed {seed}")
            records.append(run_pair(model, corpus_dir, cache_dir, recipe, seed, log, task))
            task = records[-1].pop("task")
    header = dict(machine=machine.machine_name(), zoo_commit=machine.zoo_commit(),
                  jax=jax.__version__, torch=torch_info["torch"],
                  threads=torch_info["torch_threads"], mode=mode, corpus=corpus_dir,
                  started=started.strftime("%Y-%m-%d %H:%M UTC"), seeds=list(seeds),
                  recipe=dataclasses.asdict(recipe), notes=NOTES,
                  wall_s=time.perf_counter() - start)
    paths = write_report(directory, header, records)
    for s in map(summarize, records):
        log(f"{s['model']} seed {s['seed']}: val loss zoo {s['val_loss']['zoo']:.3f} peer "
            f"{s['val_loss']['peer']:.3f}; BLEU zoo {s['bleu']['zoo']:.2f} peer "
            f"{s['bleu']['peer']:.2f}; ms/step zoo {s['ms_per_step']['zoo']:.0f} peer "
            f"{s['ms_per_step']['peer']:.0f}")
    log("wrote " + ", ".join(paths))
    return records


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="", help="directory holding bible/ (" + FETCH + ")")
    parser.add_argument("--quick", action="store_true",
                        help="reduced recipe, one seed, a fixture corpus unless --corpus")
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {MODELS}")
    parser.add_argument("--seeds", default="", help="comma-separated; default 0,1 (quick: 0)")
    parser.add_argument("--out", default="", help="results directory; default "
                        "benchmarks/results/<machine> (quick: a new temporary directory)")
    parser.add_argument("--cache", default="", help="tokenizer cache (default: a temp dir)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        models = [m for m in args.models.split(",") if m]
        unknown = sorted(set(models) - set(MODELS))
        if unknown:
            raise ConfigError(f"--models: unknown {unknown}; choose from {MODELS}")
        seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1")).split(",")]
        corpus = args.corpus
        if args.quick and not corpus:
            corpus = write_fixture_corpus(tempfile.mkdtemp(prefix="quality_translate_corpus_"))
        if not corpus:
            raise ConfigError(f"--corpus DIR is required (make it with `{FETCH}`), or --quick")
        out = args.out or (tempfile.mkdtemp(prefix="quality_translate_") if args.quick else "")
        cache = args.cache or (os.path.join(out, "cache") if args.quick else "")
        run(corpus, models, seeds, QUICK if args.quick else FULL, out, cache,
            "quick" if args.quick else "full",
            log=lambda line: print(line, flush=True))
    except errors.UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
