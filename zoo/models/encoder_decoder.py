"""The Transformer of Vaswani et al. (2017), "Attention Is All You Need": an encoder-decoder for
translation.

Source tokens are embedded, scaled by sqrt(d_model), given sinusoidal (or learned) positions and
encoded by a stack of self-attention layers; the decoder embeds the target shifted right by one
(BOS first), attends causally over it and, in every layer, over the encoder output
(cross-attention), and projects to target-vocabulary logits. Post-LN as the paper (pre-LN by
config), ReLU feed-forward, dropout on every sublayer output and on the embedding + position sums.

Embedding sharing (`TransformerConfig.share_embeddings`). The Transformer course slides end on this
question:
"编码器和解码器使用的是同一套embedding还是两套？会有使用一套embedding的模型吗？
使用两套embedding时，两套embedding如何建立联系呢" (do the encoder and decoder use one set of
embeddings or two? are there models with one set? with two, how are they related?). Both
exist, so the model offers three settings:

* 'all': one matrix is the source embedding, the target embedding and the pre-softmax projection
  (the paper's section 3.4, with a joint BPE vocabulary for both languages). One vocabulary.
* 'target': separate source embedding; the target embedding is tied to the output projection
  (Press & Wolf 2017), for separate source and target vocabularies.
* 'none': three separate matrices.
With two embedding matrices nothing ties them directly: they meet only through the
cross-attention, which learns to map source representations to what the decoder needs.

Parameters: shared_embedding (or source_embedding + target_embedding [+ output_projection]),
source_positions / target_positions (learned positions only), encoder and decoder (the zoo.nn
stacks: layer_i or a scanned 'layers' subtree with self_attention, [cross_attention,] mlp and
their norms).

Right padding is assumed on both sides (pad_id after the real tokens). Source padding is masked
out of every attention; the target needs no padding mask, since a causal query never sees the
padding that follows it, and the loss gives padding positions weight 0.

Attention weights for heat maps: pass `sow_weights=True` and make 'intermediates' mutable, then
`attention_weights` collects them per layer and head:

    logits, state = model.apply({'params': params}, source_ids, target_input_ids,
                                sow_weights=True, mutable=['intermediates'])
    maps = attention_weights(state['intermediates'])
    maps['cross'][layer, batch, head]  # [T, S]: target query x source key
"""

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from zoo import decoding
from zoo.errors import ConfigError
from zoo.models.encoder_decoder_config import (POSITIONS, SHARE_EMBEDDINGS, SIZES,
                                               TransformerConfig, activation_bytes,
                                               config_for_size, flops_per_token)
from zoo.nn import masks
from zoo.nn.embeddings import (
    Embed,
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
)
from zoo.nn.linear import Dense
from zoo.nn.transformer import TransformerDecoder, TransformerEncoder

# The config's names stay importable from here (encoder_decoder.TransformerConfig, ...).
__all__ = ["POSITIONS", "SHARE_EMBEDDINGS", "SIZES", "EncoderDecoder", "TransformerConfig",
           "TranslationState", "activation_bytes", "attention_weights", "config_for_size",
           "flops_per_token", "translate", "translation_decoder", "translation_max_len"]

_EMBED_AXES = ("act_batch", "act_len", "act_embed")


def _dtypes(config: TransformerConfig) -> dict[str, Any]:
    return dict(dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype))


def _check_ids(name: str, ids: jnp.ndarray) -> None:
    if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(
            f"EncoderDecoder: {name} must be int [batch, len], got {ids.dtype} {ids.shape}"
        )


class EncoderDecoder(nn.Module):
    """The Transformer encoder-decoder: `encode`, `decode`, or both in `__call__`.

    Attributes:
      config: the model.
      incremental: decode with KV caches (the layers' decode=True; named so as not to shadow
        the `decode` method). `init` with a full-length target creates the self-attention
        KV caches and the target position counter in the 'cache' collection (their length is the
        longest target); every later `apply(..., method='decode', mutable=['cache'])` feeds the
        next target token(s). `translation_decoder` does all this for zoo.decoding.
    """

    config: TransformerConfig
    incremental: bool = False

    def setup(self):
        cfg = self.config
        kw = _dtypes(cfg)
        d = cfg.hidden_size
        # N(0, 1/d): the sqrt(d) input scaling gives unit-variance embeddings, and as the tied
        # output projection the logits of a LayerNormed state start with unit variance too.
        embed = functools.partial(
            Embed, features=d, embedding_init=nn.initializers.normal(stddev=d ** -0.5), **kw
        )
        if cfg.share_embeddings == "all":
            self.shared_embedding = embed(cfg.target_vocab)
        else:
            self.source_embedding = embed(cfg.source_vocab)
            self.target_embedding = embed(cfg.target_vocab)
        if cfg.share_embeddings == "none":
            # No bias, so the three sharing modes differ only in what is tied.
            self.output_projection = Dense(cfg.target_vocab, ("embed", "vocab"), use_bias=False,
                                           **kw)
        if cfg.positions == "learned":
            self.source_positions = LearnedPositionalEmbedding(cfg.max_len, d, **kw)
            self.target_positions = LearnedPositionalEmbedding(
                cfg.max_len, d, decode=self.incremental, **kw)
        else:
            self.source_positions = SinusoidalPositionalEncoding(dtype=kw["dtype"])
            self.target_positions = SinusoidalPositionalEncoding(decode=self.incremental,
                                                                 dtype=kw["dtype"])
        stack = dict(
            num_heads=cfg.num_heads,
            mlp_dim=cfg.mlp_dim,
            activation=cfg.activation,
            dropout_rate=cfg.dropout_rate,
            attention_dropout_rate=cfg.attention_dropout_rate,
            layer_norm_epsilon=cfg.layer_norm_epsilon,
            norm_position=cfg.norm_position,
            backend=cfg.backend,
            attention_block=cfg.attention_block,
            scan_layers=cfg.scan_layers,
            scan_unroll=cfg.scan_unroll,
            remat=cfg.remat,
            # Glorot-uniform projections, as fairseq and the Flax WMT example.
            kernel_init=nn.initializers.xavier_uniform(),
            **kw,
        )
        self.encoder = TransformerEncoder(num_layers=cfg.num_encoder_layers, **stack)
        self.decoder = TransformerDecoder(num_layers=cfg.num_decoder_layers, cross_attention=True,
                                          decode=self.incremental, **stack)
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def _embed(self, table: Embed, positions: nn.Module, ids: jnp.ndarray,
               deterministic: bool) -> jnp.ndarray:
        """ids [B, L] -> dropout(E[ids] * sqrt(d) + P) [B, L, d] (sections 3.4, 3.5, 5.4)."""
        x = table(ids) * math.sqrt(self.config.hidden_size)  # (B, L, d)
        x = self.dropout(positions(x), deterministic=deterministic)
        return nn.with_logical_constraint(x, _EMBED_AXES)

    def encode(self, source_ids: jnp.ndarray, *, deterministic: bool = True,
               sow_weights: bool = False) -> tuple[jnp.ndarray, jnp.ndarray]:
        """Encodes right-padded source ids [B, S].

        Returns:
          (encoded [B, S, d] in config.dtype, source_valid bool [B, S], True at real tokens):
          the two things `decode` needs. Encoder outputs at padding positions carry nothing.
        """
        _check_ids("source_ids", source_ids)
        cfg = self.config
        source_valid = masks.valid_from_ids(source_ids, cfg.pad_id)  # (B, S)
        table = self.shared_embedding if cfg.share_embeddings == "all" else self.source_embedding
        x = self._embed(table, self.source_positions, source_ids, deterministic)
        window = cfg.attention_window or None
        x = self.encoder(x, masks.MaskSpec.self_attention(source_valid, window=window),
                         deterministic=deterministic, sow_weights=sow_weights)
        return x, source_valid

    def decode(self, target_input_ids: jnp.ndarray, encoded: jnp.ndarray,
               source_valid: jnp.ndarray, *, deterministic: bool = True,
               sow_weights: bool = False) -> jnp.ndarray:
        """Next-token logits for target inputs [B, T] (BOS, y_1, ..., y_{T-1}) given the source.

        Args:
          target_input_ids: int [B, T]; when incremental, the next chunk after the cached tokens.
          encoded: the encoder output [B, S, d] (`encode`).
          source_valid: bool [B, S], True at real source tokens (`encode`).
          deterministic: no dropout when True (otherwise needs a 'dropout' rng).
          sow_weights: store attention weights in 'intermediates' (see `attention_weights`).

        Returns:
          logits [B, T, V_target], float32: position t predicts target token t + 1.
        """
        _check_ids("target_input_ids", target_input_ids)
        source_valid = jnp.asarray(source_valid)
        if (encoded.ndim != 3 or source_valid.dtype != jnp.bool_
                or source_valid.shape != encoded.shape[:2]
                or encoded.shape[0] != target_input_ids.shape[0]):
            raise ValueError(
                f"EncoderDecoder.decode: need encoded [B, S, d] and bool source_valid [B, S] "
                f"(from encode) for target_input_ids {target_input_ids.shape}; got encoded "
                f"{encoded.shape} and source_valid {source_valid.dtype} {source_valid.shape}"
            )
        cfg = self.config
        table = self.shared_embedding if cfg.share_embeddings == "all" else self.target_embedding
        y = self._embed(table, self.target_positions, target_input_ids, deterministic)
        # Causal (the KV cache adds that part itself when incremental), within
        # attention_window tokens back if set; cross-attention: every query, real keys only.
        window = cfg.attention_window or None
        self_mask = masks.MaskSpec.self_attention(causal=True, window=window)
        if self.incremental and window is None:
            self_mask = None
        cross_mask = masks.MaskSpec.key_padding(source_valid)
        y = self.decoder(y, encoded, self_mask=self_mask, cross_mask=cross_mask,
                         deterministic=deterministic, sow_weights=sow_weights)  # (B, T, d)
        if cfg.share_embeddings == "none":
            logits = self.output_projection(y)
        else:
            logits = table.attend(y)  # (B, T, V): y @ E^T
        logits = nn.with_logical_constraint(logits, ("act_batch", "act_len", "act_vocab"))
        return logits.astype(jnp.float32)

    def __call__(self, source_ids: jnp.ndarray, target_input_ids: jnp.ndarray, *,
                 deterministic: bool = True, sow_weights: bool = False) -> jnp.ndarray:
        """Teacher-forced logits [B, T, V_target] float32 for source [B, S] and target inputs
        [B, T] (the target shifted right, starting with BOS)."""
        encoded, source_valid = self.encode(source_ids, deterministic=deterministic,
                                            sow_weights=sow_weights)
        return self.decode(target_input_ids, encoded, source_valid, deterministic=deterministic,
                           sow_weights=sow_weights)


def attention_weights(intermediates: Any) -> dict[str, jnp.ndarray]:
    """Attention maps sown by an apply with sow_weights=True, stacked per layer.

    Args:
      intermediates: the 'intermediates' collection of that apply (scanned or unscanned stacks).

    Returns:
      {'encoder_self': [L_enc, B, H, S, S], 'decoder_self': [L_dec, B, H, T, T],
       'cross': [L_dec, B, H, T, S]}, each row a distribution over the (unmasked) keys; the
      entries of stacks that were not run (decode alone has no encoder) are left out.
    """
    found = {}
    for key, stack, attention in (("encoder_self", "encoder", "self_attention"),
                                  ("decoder_self", "decoder", "self_attention"),
                                  ("cross", "decoder", "cross_attention")):
        tree = intermediates.get(stack)
        if tree is None:
            continue
        if "layers" in tree:  # scanned: one entry with a leading layers axis
            found[key] = tree["layers"][attention]["attention_weights"][-1]
            continue
        layers = sorted((k for k in tree if k.startswith("layer_")), key=lambda k: int(k[6:]))
        found[key] = jnp.stack([tree[k][attention]["attention_weights"][-1] for k in layers])
    return found


# ----------------------------------------------------------------------------------------------
# Decoding


class TranslationState(NamedTuple):
    """Per-sentence decoding state: the decoder's KV caches and the encoder output it reads."""

    cache: Any
    encoded: jax.Array  # (N, S, d)
    source_valid: jax.Array  # (N, S) bool


@dataclasses.dataclass(frozen=True)
class _TranslationStep:
    """zoo.decoding step: feed target tokens [N, L] through the cached decoder."""

    model: EncoderDecoder  # incremental=True

    def __call__(self, params, tokens, state: TranslationState):
        logits, mutated = self.model.apply(
            {"params": params, "cache": state.cache}, tokens, state.encoded, state.source_valid,
            method="decode", mutable=["cache"],
        )  # (N, L, V)
        return logits[:, -1], state._replace(cache=mutated["cache"])


@functools.lru_cache(maxsize=32)
def _cache_layout(model: EncoderDecoder, max_len: int):
    """(treedef, leaf shapes and dtypes for batch 1, batch axis of each leaf or None).

    The batch axis is where the cache shapes for batch 1 and 2 differ (shapes only), so scanned
    stacks, whose cache leaves lead with a layers axis, need no special case.
    """

    def shapes(batch):
        variables = jax.eval_shape(lambda: model.init(
            jax.random.key(0), jnp.zeros((batch, 1), jnp.int32),
            jnp.zeros((batch, max_len), jnp.int32)))
        return nn.unbox(variables["cache"])

    one, treedef = jax.tree.flatten(shapes(1))
    two = jax.tree.leaves(shapes(2))
    axes = tuple(next((i for i, (a, b) in enumerate(zip(x.shape, y.shape)) if a != b), None)
                 for x, y in zip(one, two))
    return treedef, tuple((x.shape, x.dtype) for x in one), axes


@functools.partial(jax.jit, static_argnums=0)
def _encode(model, params, source_ids):
    return model.apply({"params": params}, source_ids, method="encode")


def translation_decoder(model: EncoderDecoder, params: Any, source_ids: jax.Array, *,
                        max_len: int) -> decoding.Decoder:
    """Encodes `source_ids` [B, S] once and returns a zoo.decoding.Decoder for the B targets.

    The state is a TranslationState: fresh KV caches of length `max_len` plus the encoder output
    and source mask, all with batch axis 0 (the caches' own axis when layers are scanned), so
    beam search tiles and reorders the encoder output together with the caches.

    Args:
      model: an EncoderDecoder (incremental or not; decoding runs an incremental clone).
      params: its parameters.
      source_ids: int [B, S], right-padded with config.pad_id.
      max_len: longest target row, BOS included (the decoding loops' max_len).
    """
    if not isinstance(model, EncoderDecoder):
        raise TypeError(f"translation_decoder: model must be an EncoderDecoder, got {type(model)}")
    if not isinstance(max_len, (int, np.integer)) or max_len < 2:
        raise ValueError(f"translation_decoder: max_len={max_len!r} must be an int >= 2 (BOS and "
                         "at least one token)")
    source_ids = jnp.asarray(source_ids)
    _check_ids("source_ids", source_ids)
    model = model.clone(parent=None, incremental=False)
    encoded, source_valid = _encode(model, params, source_ids)
    stepper = model.clone(parent=None, incremental=True)
    treedef, leaves, axes = _cache_layout(stepper, int(max_len))
    batch = source_ids.shape[0]
    cache = treedef.unflatten([
        # Every zoo.nn cache variable starts at zero: empty keys/values, index 0, position 0.
        jnp.zeros(shape if a is None else shape[:a] + (batch,) + shape[a + 1:], dtype)
        for (shape, dtype), a in zip(leaves, axes)
    ])
    return decoding.Decoder(
        step=_TranslationStep(stepper),
        params=params,
        state=TranslationState(cache, encoded, source_valid),
        batch_axes=axes + (0, 0),  # leaves in TranslationState order: cache, encoded, valid
        max_len=int(max_len),
    )


def translation_max_len(config: TransformerConfig, source_ids: Any, max_len_a: float = 1.0,
                        max_len_b: int = 50) -> int:
    """Target rows for `translate`: BOS + int(a * |x| + b) tokens, at most config.max_len.

    |x| is the longest real (non-pad) source in the batch, read on the host, as fairseq's
    max_len_a / max_len_b (the paper: input length + 50).
    """
    ids = np.asarray(source_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"translate: source_ids must be int [batch, len], got {ids.dtype} "
                         f"{ids.shape}")
    longest = int((ids != config.pad_id).sum(axis=1).max(initial=0))
    max_out = int(max_len_a * longest + max_len_b)
    if max_out < 1:
        raise ConfigError(f"translate: max_len_a * |x| + max_len_b = {max_out} allows no output "
                          f"token (|x| = {longest}); raise max_len_b")
    return min(1 + max_out, config.max_len)


def translate(model: EncoderDecoder, params: Any, source_ids: jax.Array, *,
              method: str = "greedy", beam_size: int = 4, alpha: float = 0.6,
              max_len_a: float = 1.0, max_len_b: int = 50) -> decoding.Decoded:
    """Translates a batch of right-padded sources [B, S] by greedy or beam search.

    At most a * |x| + b target tokens (EOS included) are generated, |x| the longest real source
    in the batch (`translation_max_len`). Beam search defaults to the paper's beam 4 and alpha 0.6,
    but scores with zoo.decoding's length normalisation log P / L^alpha (the course slides on
    sequence generation and attention), not the paper's GNMT penalty ((5 + L) / 6)^alpha.

    Args:
      model, params: the EncoderDecoder and its parameters.
      source_ids: int [B, S], right-padded with config.pad_id.
      method: 'greedy' or 'beam'.
      beam_size, alpha: beam search settings (ignored by greedy).
      max_len_a, max_len_b: the output length limit a * |x| + b.

    Returns:
      Decoded with tokens [B, L] (the translation without BOS: tokens, EOS, then pad), lengths
      [B] (tokens before the padding, EOS included) and scores [B] (greedy: log-probability;
      beam: the best hypothesis's normalised score). For all beams use `translation_decoder`
      with zoo.decoding.beam_search.
    """
    if method not in ("greedy", "beam"):
        raise ValueError(f"translate: method={method!r}; use 'greedy' or 'beam'")
    cfg = model.config
    ids = np.asarray(source_ids)
    max_len = translation_max_len(cfg, ids, max_len_a, max_len_b)
    decoder = translation_decoder(model, params, ids, max_len=max_len)
    prompts = np.full((ids.shape[0], 1), cfg.bos_id, np.int32)
    ends = dict(eos_id=cfg.eos_id, pad_id=cfg.pad_id)
    if method == "greedy":
        out = decoding.greedy(decoder, prompts, max_len=max_len, **ends)
    else:
        out = decoding.beam_search(decoder, prompts, beam_size=beam_size, max_len=max_len,
                                   alpha=alpha, **ends)
        out = decoding.Decoded(out.tokens[:, 0], out.lengths[:, 0], out.scores[:, 0])
    return decoding.Decoded(out.tokens[:, 1:], jnp.maximum(out.lengths - 1, 0), out.scores)
