"""benchmarks.quality_translate's PyTorch peers: torch.nn.Transformer made zoo's translation
Transformer (post-norm stacks without a final LayerNorm, no attention or feed-forward-inner
dropout, q/k/v drawn as three Glorot matrices, zero feed-forward biases, LayerNorm eps 1e-6),
an nn.LSTM / nn.GRU encoder-decoder with Bahdanau (additive) or Luong (general) attention, both
in zoo's init family; the side that trains them as a PyTorch user does; and their beam search
(no cache: the decoder re-runs over the whole prefix each step)."""

import math

import ml_collections
import numpy as np

from zoo.errors import ConfigError
from zoo.train import optim


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
