"""The RNN encoder-decoder for translation, without attention (the seq2seq model of the course
slides on sequence generation and attention) or with it (Bahdanau et al. 2015; Luong et al.
2015).

The slides' model: "编码器是没有输出层的标准 RNN 模型 ... 编码器在上一时间步骤中的隐含状态用作
解码器的初始隐藏状态" (the encoder is a plain RNN without an output layer; its hidden state at
the last step is the decoder's initial state). An encoder RNN reads the source embeddings
x_1..x_S; u = h_S^enc, and the decoder RNN starts from h_0^dec = u and reads the target shifted
right (BOS, y_1, ..., y_{T-1}), each state h_t^dec scored against the vocabulary (o_t =
softmax(W_o h_t^dec + b)). Every layer of the stack hands its own final state to the same layer
of the decoder. This is Sutskever et al. (2014)'s form (they also read the source reversed; here
it is read in order). Cho et al. (2014) instead feed the summary c to the decoder at *every*
step, into the state update and the output layer (and start the decoder from tanh(V c)); that
variant is not implemented.

Attention (`Seq2SeqConfig.attention`). The fixed-size u must hold the whole source; with
attention the decoder reads every encoder output h_1..h_S (the last layer's, the memory) at
every step through a distribution alpha_t over the real source positions (padding gets weight
0) and the context c_t = sum_s alpha_ts h_s:

* 'additive' (Bahdanau; the course slides' "注意力输出与嵌入输出拼接,以输入解码器中的第一个循环神经网络
  层"): the query is the *previous* decoder state s_{t-1} (the top layer's h; s_0 = u's top
  layer), score(h_s, s_{t-1}) = v^T tanh(W_k h_s + W_q s_{t-1}), and the context is
  concatenated with the embedding of y_{t-1} as the first decoder layer's input. The output
  layer reads s_t.
* 'dot' and 'general' (Luong): the stack first steps on [e(y_{t-1}); h~_{t-1}] (input feeding;
  h~_0 = 0), then the *current* top state h_t is the query: score = h_s^T h_t ('dot') or
  h_s^T W h_t ('general'); the attentional vector h~_t = tanh(W_c [c_t; h_t]) feeds the output
  layer and the next step's input.

The scorers are those of zoo.nn.scoring (AdditiveScore, DotScore, BilinearScore), written here
as pure functions over parameters fetched once: the decoder's recurrence is a `jax.lax.scan`
over target positions built from the cells' weights / project / step API (zoo.nn.recurrent), and
the keys' half of each score (W_k h_s, or W^T h_s for 'general') is computed once per sentence,
before the loop, not once per step.

Bidirectional encoder (`bidirectional=True`): each direction has hidden_size units, the memory
is [forward; backward] (2 * hidden_size wide), and each layer's final (forward, backward) states
are bridged to the decoder's size by a Dense + tanh per state component (h, and c for the LSTM):
s_0 = tanh(W_b [h_fwd; h_bwd] + b), as Bahdanau et al. initialise from the backward state. 'dot'
needs keys as wide as the decoder state, so it takes a unidirectional encoder.

Decoding (`seq2seq_decoder`): the source is encoded once; the zoo.decoding state is a
DecoderState (decoder carries, memory, precomputed keys, source mask, input-feeding vector),
every leaf with batch axis 0, and each step runs `Seq2Seq.decode` on one token from it, the same
code that teacher forcing runs over the whole target.

Dropout (`dropout_rate`) on the source and target embeddings, between stacked layers (encoder
and decoder) and before the output layer; never on the recurrent state. For Luong attention the
fed-back h~_{t-1} is the undropped one.

Attention weights: `apply(..., sow_weights=True, mutable=['intermediates'])` stores alpha as
`intermediates['attention_weights'][0]`, [B, T, S] float32 (row t: the weights used for the
output at position t).

Parameters (G gates: 4 LSTM, 3 GRU, 1 Elman; E = embed_dim, H = hidden_size, M = memory width):

    shared_embedding/embedding  (V, E)  (or source_embedding + target_embedding)
    encoder/layer_{k}/...       zoo.nn.recurrent.StackedRNN (forward/backward when bidirectional)
    bridge_{k}_{j}/kernel, bias (2H, H)  bidirectional only; j = 0 (GRU/RNN h; LSTM c), 1 (h)
    decoder/layer_{k}/...       attention 'none': a StackedRNN
    decoder_layer_{k}/...       with attention: cells; layer 0 reads E + M (additive) or E + H
    attention/...               additive: key_kernel (M, H), query_kernel (H, H), v (H,);
                                general: query_kernel (H, M); Luong: output_kernel (M + H, H)
    output_projection/kernel, bias  (H, V)

Right padding is assumed for the source (pad_id after the real tokens): the encoder runs with
each row's length, so padding never enters a state, and attention masks it out.
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from zoo import decoding
from zoo.models.seq2seq_config import (ATTENTIONS, SIZES, Seq2SeqConfig, activation_bytes,
                                       config_for_size, flops_per_token)
from zoo.nn.embeddings import Embed
from zoo.nn.linear import Dense
from zoo.nn.masks import masked_softmax
from zoo.nn.recurrent import StackedRNN
from zoo.nn.recurrent_cells import make_cell

# The config's names stay importable from here (seq2seq.Seq2SeqConfig, seq2seq.config_for_size).
__all__ = ["ATTENTIONS", "SIZES", "DecoderState", "Seq2Seq", "Seq2SeqConfig", "activation_bytes",
           "attention_weights", "config_for_size", "flops_per_token", "seq2seq_decoder"]

_OUT_AXES = ("act_batch", "act_len", "act_rnn_hidden")


def _dtypes(config: Seq2SeqConfig) -> dict[str, Any]:
    return dict(dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype))


def _check_ids(name: str, ids: jnp.ndarray) -> None:
    if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"Seq2Seq: {name} must be int [batch, len], got {ids.dtype} {ids.shape}")


def _top_h(carry) -> jax.Array:
    """The hidden state h (B, H) of a cell carry: (c, h) for the LSTM, h for GRU / Elman."""
    return carry[1] if isinstance(carry, tuple) else carry


class DecoderState(NamedTuple):
    """Per-sentence decoding state; every leaf has batch axis 0 (beam search tiles/reorders it).

    Attributes:
      carries: one float32 cell carry per decoder layer ((c, h) LSTM, h GRU/Elman), each (B, H).
      memory: (B, S, M) the encoder's last-layer outputs, zero at padding.
      keys: (B, S, K) the keys' half of the scores, computed once per sentence (additive:
        W_k h_s, K = H; general: W^T h_s, K = H; dot: h_s; none: K = 0).
      valid: (B, S) bool, True at real source tokens.
      feed: (B, H) Luong's h~_{t-1} for input feeding (zeros at the start); (B, 0) otherwise.
    """

    carries: tuple
    memory: jax.Array
    keys: jax.Array
    valid: jax.Array
    feed: jax.Array


class _Attention(nn.Module):
    """The attention's parameters (`weights`) and its pure per-step maths, for use in a scan.

    The scores are zoo.nn.scoring's AdditiveScore / DotScore / BilinearScore (same kernels,
    logical axes and inits), split into a per-sentence half (`keys`) and a per-step half
    (`attend`), so the loop body holds no parameter fetch and no key projection.
    """

    kind: str  # 'additive' | 'dot' | 'general'
    hidden_size: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def _kernel(self, name, shape):
        return self.param(name, nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                             ("embed", "mlp")),
                          shape, self.param_dtype).astype(self.dtype)

    @nn.compact
    def weights(self, memory_size: int) -> dict[str, jax.Array]:
        """Creates or fetches the parameters (cast to `dtype`) for memory width M."""
        h, w = self.hidden_size, {}
        if self.kind == "additive":
            w["key_kernel"] = self._kernel("key_kernel", (memory_size, h))  # W_k
            w["query_kernel"] = self._kernel("query_kernel", (h, h))  # W_q
            w["v"] = self.param("v", nn.with_logical_partitioning(
                lambda k, s, d: jax.random.normal(k, s, d) * s[-1] ** -0.5, ("mlp",)),
                (h,), self.param_dtype).astype(self.dtype)
        if self.kind == "general":
            w["query_kernel"] = self._kernel("query_kernel", (h, memory_size))  # W
        if self.kind in ("dot", "general"):
            # W_c of h~ = tanh(W_c [c; h]); no bias, as Luong et al.'s eq. 5.
            w["output_kernel"] = self.param(
                "output_kernel", nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                              ("rnn_in", "rnn_hidden")),
                (memory_size + h, h), self.param_dtype).astype(self.dtype)
        return w

    @nn.nowrap
    def keys(self, w: dict[str, jax.Array], memory: jax.Array) -> jax.Array:
        """The per-sentence half of the scores: memory (B, S, M) -> keys (B, S, K)."""
        memory = memory.astype(self.dtype)
        if self.kind == "additive":
            return jnp.einsum("bsm,mh->bsh", memory, w["key_kernel"])  # W_k h_s
        if self.kind == "general":
            # h_s^T W q = (W^T h_s) . q: project the keys once instead of the query each step.
            return jnp.einsum("bsm,hm->bsh", memory, w["query_kernel"])
        return memory

    @nn.nowrap
    def attend(self, w, query, keys, memory, valid) -> tuple[jax.Array, jax.Array]:
        """One step: query (B, H) -> (context (B, M) in `dtype`, weights (B, S) float32)."""
        query = query.astype(self.dtype)
        if self.kind == "additive":
            uq = jnp.einsum("bh,hk->bk", query, w["query_kernel"])  # (B, H)
            hidden = jnp.tanh(keys + uq[:, None, :])  # (B, S, H)
            scores = jnp.einsum("bsh,h->bs", hidden, w["v"], preferred_element_type=jnp.float32)
        else:
            scores = jnp.einsum("bsh,bh->bs", keys, query, preferred_element_type=jnp.float32)
        alpha = masked_softmax(scores, valid)  # (B, S), 0 at padding
        context = jnp.einsum("bs,bsm->bm", alpha.astype(self.dtype), memory.astype(self.dtype))
        return context, alpha

    @nn.nowrap
    def attentional(self, w, context, h) -> jax.Array:
        """Luong's h~_t = tanh(W_c [c_t; h_t]): (B, M), (B, H) -> (B, H)."""
        both = jnp.concatenate([context.astype(self.dtype), h.astype(self.dtype)], axis=-1)
        return jnp.tanh(both @ w["output_kernel"])


class Seq2Seq(nn.Module):
    """The RNN encoder-decoder: `encode` / `initial_state`, `decode`, or both in `__call__`."""

    config: Seq2SeqConfig

    def setup(self):
        cfg = self.config
        kw = _dtypes(cfg)
        if cfg.share_embeddings:
            self.shared_embedding = Embed(cfg.vocab_size, cfg.embed_dim, **kw)
        else:
            self.source_embedding = Embed(cfg.vocab_size, cfg.embed_dim, **kw)
            self.target_embedding = Embed(cfg.vocab_size, cfg.embed_dim, **kw)
        rnn = dict(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, cell=cfg.cell,
                   dropout_rate=cfg.dropout_rate, **kw)
        self.encoder = StackedRNN(bidirectional=cfg.bidirectional, **rnn)
        if cfg.bidirectional:
            parts = 2 if cfg.cell == "lstm" else 1
            self.bridge = [Dense(cfg.hidden_size, ("rnn_in", "rnn_hidden"), **kw,
                                 name=f"bridge_{k}_{j}")
                           for k in range(cfg.num_layers) for j in range(parts)]
        if cfg.attention == "none":
            self.decoder = StackedRNN(**rnn)
        else:
            self.decoder_cells = [make_cell(cfg.cell, cfg.hidden_size, **kw,
                                            name=f"decoder_layer_{k}")
                                  for k in range(cfg.num_layers)]
            self.attention = _Attention(cfg.attention, cfg.hidden_size, **kw)
        self.output_projection = Dense(cfg.vocab_size, ("embed", "vocab"), **kw)
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def _embed(self, ids, source: bool, deterministic: bool) -> jax.Array:
        cfg = self.config
        if cfg.share_embeddings:
            table = self.shared_embedding
        else:
            table = self.source_embedding if source else self.target_embedding
        return self.dropout(table(ids), deterministic=deterministic)  # (B, L, E)

    def _bridge(self, carries: tuple) -> tuple:
        """Bidirectional: each layer's (forward, backward) carries -> one carry of width H."""
        if not self.config.bidirectional:
            return carries
        parts = 2 if self.config.cell == "lstm" else 1
        out = []
        for k, (fwd, bwd) in enumerate(carries):
            leaves = [
                jnp.tanh(self.bridge[k * parts + j](jnp.concatenate([f, b], axis=-1))
                         ).astype(jnp.float32)  # (B, 2H) -> (B, H)
                for j, (f, b) in enumerate(zip(jax.tree.leaves(fwd), jax.tree.leaves(bwd)))]
            out.append(jax.tree.unflatten(jax.tree.structure(fwd), leaves))
        return tuple(out)

    def encode(self, source_ids: jax.Array, *, deterministic: bool = True
               ) -> tuple[jax.Array, jax.Array, tuple]:
        """Encodes right-padded source ids [B, S].

        Returns:
          (memory [B, S, M] in dtype, zero at padding; valid bool [B, S]; carries: per layer the
          encoder's final state at each row's last real token, bridged to H when bidirectional:
          the decoder's initial state).
        """
        _check_ids("source_ids", source_ids)
        valid = source_ids != self.config.pad_id  # (B, S)
        lengths = valid.sum(axis=1)
        x = self._embed(source_ids, True, deterministic)
        memory, carries = self.encoder(x, lengths, deterministic=deterministic)
        return nn.with_logical_constraint(memory, _OUT_AXES), valid, self._bridge(carries)

    def initial_state(self, source_ids: jax.Array, *, deterministic: bool = True
                      ) -> DecoderState:
        """Encodes the source and returns the decoder's state before its first step."""
        cfg = self.config
        memory, valid, carries = self.encode(source_ids, deterministic=deterministic)
        batch = source_ids.shape[0]
        if cfg.attention == "none":
            keys = memory[..., :0]
        else:
            keys = self.attention.keys(self.attention.weights(cfg.memory_size), memory)
        feed = jnp.zeros((batch, cfg.hidden_size if cfg.luong else 0), jnp.dtype(cfg.dtype))
        return DecoderState(carries, memory, keys, valid, feed)

    def decode(self, target_input_ids: jax.Array, state: DecoderState, *,
               deterministic: bool = True, sow_weights: bool = False
               ) -> tuple[jax.Array, DecoderState]:
        """Next-token logits for target inputs [B, T] from `state`, and the state after them.

        Teacher forcing passes the whole shifted target and `initial_state`; decoding passes one
        token at a time and the previous call's state.

        Returns:
          (logits [B, T, V] float32, the DecoderState after position T - 1).
        """
        _check_ids("target_input_ids", target_input_ids)
        cfg = self.config
        y = self._embed(target_input_ids, False, deterministic)  # (B, T, E)
        if cfg.attention == "none":
            outputs, carries = self.decoder(y, None, state.carries, deterministic=deterministic)
            state = state._replace(carries=carries)
        else:
            outputs, state, alpha = self._attention_decoder(y, state, deterministic)
            if sow_weights:
                self.sow("intermediates", "attention_weights", alpha)
        outputs = nn.with_logical_constraint(outputs, _OUT_AXES)
        logits = self.output_projection(self.dropout(outputs, deterministic=deterministic))
        logits = nn.with_logical_constraint(logits, ("act_batch", "act_len", "act_vocab"))
        return logits.astype(jnp.float32), state

    def _attention_decoder(self, y, state: DecoderState, deterministic: bool):
        """The step-by-step decoder with attention: y (B, T, E) -> (outputs (B, T, H), state,
        alpha (B, T, S))."""
        cfg = self.config
        dtype, e = jnp.dtype(cfg.dtype), cfg.embed_dim
        cells, attention = self.decoder_cells, self.attention
        extra = cfg.memory_size if cfg.attention == "additive" else cfg.hidden_size
        ws = [cells[0].weights(e + extra)] + [c.weights(cfg.hidden_size) for c in cells[1:]]
        wa = attention.weights(cfg.memory_size)
        # Layer 0's input is [e(y_{t-1}); extra]: the embedding half of its input projection is
        # one matmul for every step, (B, T, E) -> (T, B, G, H); the context / feed half is left
        # to the loop.
        w0 = ws[0]
        xe = cells[0].project({"input_kernel": w0["input_kernel"][:e], "bias": w0["bias"]}, y,
                              time_major=True)
        extra_kernel = w0["input_kernel"][e:]  # (extra, G, H)
        steps, batch = xe.shape[0], xe.shape[1]
        masks = None
        if not deterministic and cfg.dropout_rate > 0 and cfg.num_layers > 1:
            # Between-layer dropout masks for every step, drawn before the loop: (T, L-1, B, H).
            keep = 1.0 - cfg.dropout_rate
            masks = jax.random.bernoulli(self.make_rng("dropout"), keep,
                                         (steps, cfg.num_layers - 1, batch, cfg.hidden_size))
            masks = masks.astype(dtype) / keep

        def body(carry, inputs):
            carries, feed = carry
            xe_t, mask_t = inputs
            if cfg.attention == "additive":
                # Bahdanau: the previous top state s_{t-1} queries; the context joins the input.
                context, alpha = attention.attend(wa, _top_h(carries[-1]), state.keys,
                                                  state.memory, state.valid)
                feed_in = context
            else:
                feed_in = feed  # Luong's input feeding of h~_{t-1}
            xp = xe_t + jnp.einsum("bd,dgh->bgh", feed_in.astype(dtype), extra_kernel,
                                   preferred_element_type=jnp.float32)  # (B, G, H)
            new_carries, h = [], None
            for k, (cell, w) in enumerate(zip(cells, ws)):
                if k:  # the layer below's h_t, dropped out between layers in training
                    xp = cell.project(w, h if mask_t is None else h * mask_t[k - 1])  # (B, G, H)
                c, h = cell.step(w, carries[k], xp)
                new_carries.append(c)
            if cfg.luong:
                # Luong: the current top state h_t queries; h~_t goes to the softmax.
                context, alpha = attention.attend(wa, h, state.keys, state.memory, state.valid)
                h = feed = attention.attentional(wa, context, h)
            return (tuple(new_carries), feed), (h.astype(dtype), alpha)

        (carries, feed), (outputs, alpha) = jax.lax.scan(
            body, (state.carries, state.feed), (xe, masks))
        # (T, B, ...) -> (B, T, ...)
        outputs, alpha = jnp.swapaxes(outputs, 0, 1), jnp.swapaxes(alpha, 0, 1)
        return outputs, state._replace(carries=carries, feed=feed), alpha

    def __call__(self, source_ids: jax.Array, target_input_ids: jax.Array, *,
                 deterministic: bool = True, sow_weights: bool = False) -> jax.Array:
        """Teacher-forced logits [B, T, V] float32 for source [B, S] and target inputs [B, T]
        (the target shifted right, starting with BOS)."""
        state = self.initial_state(source_ids, deterministic=deterministic)
        logits, _ = self.decode(target_input_ids, state, deterministic=deterministic,
                                sow_weights=sow_weights)
        return logits


def attention_weights(intermediates: Any) -> jax.Array:
    """alpha [B, T, S] float32 from an apply with sow_weights=True (attention models only)."""
    if "attention_weights" not in intermediates:
        raise ValueError("attention_weights: no weights were sown; apply a model with attention "
                         "(not 'none') with sow_weights=True and mutable=['intermediates']")
    return intermediates["attention_weights"][-1]


# ----------------------------------------------------------------------------------------------
# Decoding


@dataclasses.dataclass(frozen=True)
class _Seq2SeqStep:
    """zoo.decoding step: feed target tokens [N, L] from the DecoderState."""

    model: Seq2Seq

    def __call__(self, params, tokens, state: DecoderState):
        logits, state = self.model.apply({"params": params}, tokens, state, method="decode")
        return logits[:, -1], state  # (N, V)


@functools.partial(jax.jit, static_argnums=0)
def _initial_state(model, params, source_ids):
    return model.apply({"params": params}, source_ids, method="initial_state")


def seq2seq_decoder(model: Seq2Seq, params: Any, source_ids: jax.Array, *,
                    max_len: int | None = None) -> decoding.Decoder:
    """Encodes `source_ids` [B, S] once and returns a zoo.decoding.Decoder for the B targets.

    The state is a DecoderState (every leaf batch axis 0), so beam search tiles and reorders the
    memory and source mask together with the decoder's carries.

    Args:
      model: a Seq2Seq.
      params: its parameters.
      source_ids: int [B, S], right-padded with config.pad_id.
      max_len: longest target row, BOS included, or None (an RNN state has no length bound).
    """
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"seq2seq_decoder: model must be a Seq2Seq, got {type(model)}")
    if max_len is not None and (not isinstance(max_len, (int, np.integer)) or max_len < 2):
        raise ValueError(f"seq2seq_decoder: max_len={max_len!r} must be None or an int >= 2 "
                         "(BOS and at least one token)")
    source_ids = jnp.asarray(source_ids)
    _check_ids("source_ids", source_ids)
    state = _initial_state(model, params, source_ids)
    return decoding.Decoder(step=_Seq2SeqStep(model), params=params, state=state,
                            batch_axes=(0,) * len(jax.tree.leaves(state)),
                            max_len=None if max_len is None else int(max_len))
