"""ELMo (Peters et al. 2018, "Deep contextualized word representations"): a bidirectional LSTM
language model whose layers, mixed by learned softmax weights, are features for other tasks.

The biLM is two language models over the same tokens, trained jointly (their losses summed):

* forward:  p(t_k | t_1 .. t_{k-1}), an L-layer LSTM reading left to right;
* backward: p(t_k | t_{k+1} .. t_N), an L-layer LSTM reading right to left.

The two directions have their own LSTM weights but share the token representation (the input
embedding) and the softmax, as in the paper (section 3.1). Between LSTM layers a residual
connection adds layer k-1's output to layer k's (from the second layer on), as ELMo's biLM has.

For a downstream task, token k has L + 1 representations, each 2H wide:

    h_0 = [x_k; x_k]                 the token embedding, duplicated so every layer is 2H wide
                                     (the paper's "[x_k; x_k]" for its context-insensitive layer)
    h_j = [fwd_j(k); bwd_j(k)]       j = 1 .. L, the two directions' layer-j outputs

and ELMo_k = gamma * sum_j softmax(s)_j h_j (eq. 1) with trainable s (L + 1 scalars) and gamma:
`ScalarMix`. The biLM stays frozen downstream; only s, gamma and the task model train.

The paper's biLM reads characters (a char CNN with highway layers) and its LSTMs have 4096 cells
projected to 512; this one reads a word vocabulary (with <unk>) and its LSTMs are plain, H units
wide, the token embedding H wide too. Inputs are padded rows [B, T] with lengths [B]; a row holds
consecutive sentences, each wrapped in <s> ... </s> (SPECIALS), as bilm-tf streams sentences:
the LMs learn where sentences start and end and carry context across them.

Parameters (V vocabulary, H = hidden_size, L = num_layers):

    embed/embedding                  (V, H)       ('vocab', 'embed')
    forward_{k}/cell/..., backward_{k}/cell/...   LSTM kernels (zoo.nn.recurrent layout)
    softmax/kernel, bias             (H, V), (V,) ('embed', 'vocab')
"""

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.models.config_checks import check_float_dtypes
from zoo.nn.embeddings import Embed
from zoo.nn.linear import Dense
from zoo.nn.recurrent import BACKENDS as RNN_BACKENDS
from zoo.nn.recurrent import RNN

Array = jax.Array

# The biLM's vocabulary starts with these (zoo.tasks.elmo builds it); a row is one or more
# sentences, each wrapped as <s> w_1 .. w_n </s>, then <pad>.
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(len(SPECIALS))
_LAYERS_AXES = ("act_batch", None, "act_len", "act_embed")


@dataclasses.dataclass(frozen=True)
class BiLMConfig:
    """Attributes:
      vocab_size: |V|, the shared softmax size (specials included).
      hidden_size: H, the token embedding width and each direction's LSTM units; ELMo features
        are 2H wide.
      num_layers: L, LSTM layers per direction (ELMo: 2); features mix L + 1 layers.
      residual: add each LSTM layer's input to its output from the second layer on (ELMo's biLM).
      dropout_rate: dropout on the embeddings, between layers and before the softmax (ELMo: 0.1).
      dtype: compute dtype of the matmuls; the LSTM carries and the logits stay float32.
      param_dtype: storage dtype of the parameters.
      rnn_backend: how the LSTMs run (zoo.nn.recurrent.RNN's backend): 'scan' (any device),
        'cpu_fused' (zoo's LSTM kernel; a CPU, float32) or 'cudnn' (a GPU, float32). The
        parameters are the same for all three.
    """

    vocab_size: int
    hidden_size: int = 64
    num_layers: int = 2
    residual: bool = True
    dropout_rate: float = 0.0
    dtype: str = "float32"
    param_dtype: str = "float32"
    rnn_backend: str = "scan"

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"BiLMConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ConfigError(f"BiLMConfig.dropout_rate must be in [0, 1), got {self.dropout_rate}")
        check_float_dtypes(self, "BiLMConfig")
        if self.rnn_backend not in RNN_BACKENDS:
            raise ConfigError(f"BiLMConfig.rnn_backend must be one of {RNN_BACKENDS}, got "
                              f"{self.rnn_backend!r}")

    @property
    def feature_dim(self) -> int:
        """Width of every layer representation and of the ELMo vectors: 2H."""
        return 2 * self.hidden_size


# (hidden_size, num_layers). tiny follows the house rule (2 layers, width <= 64); base has
# ELMo's 512-wide layers (the paper reaches them by projecting 4096 LSTM cells, not here).
SIZES: dict[str, tuple[int, int]] = {
    "tiny": (32, 2),
    "base": (512, 2),
}


def config_for_size(size: str, **overrides: Any) -> BiLMConfig:
    """A named size ('tiny' for tests and the CPU demo, 'base'), fields overridable."""
    if size not in SIZES:
        raise ConfigError(f"config.model.size: unknown biLM size {size!r}; choose from "
                          f"{list(SIZES)}")
    hidden_size, num_layers = SIZES[size]
    return BiLMConfig(**{"hidden_size": hidden_size, "num_layers": num_layers, **overrides})


def flops_per_token(cfg: BiLMConfig) -> float:
    """Training FLOPs per token: 3 x the forward matmuls of both directions, each with L LSTM
    layers (4 gates, H x (H + H) per gate: 8 H^2 multiply-adds) and the shared softmax (H V)."""
    h = cfg.hidden_size
    per_direction = cfg.num_layers * 4 * h * (h + h) + h * cfg.vocab_size
    return 3.0 * 2.0 * 2 * per_direction


class BiLM(nn.Module):
    """The forward and backward LSTM LMs with a shared embedding and softmax."""

    config: BiLMConfig

    def setup(self):
        cfg = self.config
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        # Unit-variance token vectors (PyTorch nn.Embedding's init) rather than BERT's N(0, 0.02):
        # a rare word's vector is then mostly its own random draw, which LM training (that only
        # needs its type) leaves distinct, so h_0 still tells words apart downstream.
        self.embed = Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype, param_dtype=param_dtype,
                           embedding_init=nn.initializers.normal(stddev=1.0))
        lstm = {"hidden_size": cfg.hidden_size, "cell": "lstm", "dtype": dtype,
                "param_dtype": param_dtype, "backend": cfg.rnn_backend}
        # Separate weights per direction; RNN(reverse=True) reads each row from its last valid
        # position back to 0 and aligns the outputs with the input positions.
        self.forward = [RNN(reverse=False, **lstm) for _ in range(cfg.num_layers)]
        self.backward = [RNN(reverse=True, **lstm) for _ in range(cfg.num_layers)]
        self.dropout = nn.Dropout(cfg.dropout_rate)
        self.softmax = Dense(cfg.vocab_size, ("embed", "vocab"), dtype=dtype,
                             param_dtype=param_dtype)

    def _check(self, ids: Array, lengths: Array | None) -> Array:
        if ids.ndim != 2:
            raise ValueError(f"BiLM: ids must be [batch, length], got shape {ids.shape}")
        if lengths is None:
            return jnp.full((ids.shape[0],), ids.shape[1], jnp.int32)
        if jnp.shape(lengths) != ids.shape[:1]:
            raise ValueError(f"BiLM: lengths must have shape ({ids.shape[0]},), got "
                             f"{jnp.shape(lengths)}")
        return lengths

    def _stacks(self, ids, lengths, deterministic):
        """Embeddings x (B, T, H) and each direction's per-layer outputs, L x (B, T, H)."""
        x = self.embed(ids)  # (B, T, H)
        outputs = {}
        for name, stack in (("forward", self.forward), ("backward", self.backward)):
            h, layers = x, []
            for k, rnn in enumerate(stack):
                y, _ = rnn(self.dropout(h, deterministic=deterministic), lengths)  # (B, T, H)
                if self.config.residual and k > 0:
                    y = y + h  # ELMo's residual between LSTM layers (both H wide)
                layers.append(y)
                h = y
            outputs[name] = layers
        return x, outputs["forward"], outputs["backward"]

    def __call__(self, ids: Array, lengths: Array | None = None, *,
                 deterministic: bool = True) -> tuple[Array, Array]:
        """Both directions' next-token logits.

        Args:
          ids: [B, T] token ids, padding after each row's length.
          lengths: [B] valid lengths (None: every row fills T).
          deterministic: disable dropout; when False, needs a 'dropout' rng.

        Returns:
          (forward, backward) logits, each [B, T, V] float32: forward[:, t] scores token t + 1
          from tokens <= t; backward[:, t] scores token t - 1 from tokens >= t.
        """
        lengths = self._check(ids, lengths)
        _, fwd, bwd = self._stacks(ids, lengths, deterministic)
        logits = []
        for top in (fwd[-1], bwd[-1]):
            y = self.softmax(self.dropout(top, deterministic=deterministic))  # (B, T, V)
            y = nn.with_logical_constraint(y, ("act_batch", "act_len", "act_vocab"))
            logits.append(y.astype(jnp.float32))
        return logits[0], logits[1]

    def layers(self, ids: Array, lengths: Array | None = None) -> Array:
        """The L + 1 token representations [B, L + 1, T, 2H] (no dropout): h_0 = [x; x], then
        [forward_j; backward_j] per LSTM layer; zero past each row's length."""
        lengths = self._check(ids, lengths)
        x, fwd, bwd = self._stacks(ids, lengths, deterministic=True)
        valid = (jnp.arange(ids.shape[1])[None, :] < lengths[:, None])[..., None]  # (B, T, 1)
        # The RNN outputs are already zero past the length; the embeddings of padding are not.
        x = jnp.where(valid, x, 0).astype(fwd[0].dtype)
        reps = [jnp.concatenate([x, x], axis=-1)]
        reps += [jnp.concatenate([f, b], axis=-1) for f, b in zip(fwd, bwd)]  # L x (B, T, 2H)
        return nn.with_logical_constraint(jnp.stack(reps, axis=1), _LAYERS_AXES)


class ScalarMix(nn.Module):
    """ELMo's task-specific combination of layers: gamma * sum_j softmax(s)_j h_j.

    s starts at zero (equal weights) and gamma at one, as in AllenNLP's ScalarMix. The softmax
    and the weighted sum are computed in float32.

    Attributes:
      num_layers: how many representations are mixed (the biLM's L + 1).
      layer_norm: normalise each representation over its features (per token, no learned
        scale) before mixing; the paper found this helps some tasks. Off by default.
    """

    num_layers: int
    layer_norm: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, layers: Array) -> Array:
        """layers [B, num_layers, T, D] -> mixed [B, T, D] in dtype."""
        if layers.ndim != 4 or layers.shape[1] != self.num_layers:
            raise ValueError(f"ScalarMix: layers must be [batch, {self.num_layers}, length, "
                             f"features], got shape {layers.shape}")
        s = self.param("scalar_weights",
                       nn.with_logical_partitioning(nn.initializers.zeros_init(), ("layers",)),
                       (self.num_layers,), self.param_dtype)
        gamma = self.param("gamma", nn.with_logical_partitioning(nn.initializers.ones_init(), ()),
                           (), self.param_dtype)
        h = layers.astype(jnp.float32)
        if self.layer_norm:
            mean = h.mean(axis=-1, keepdims=True)
            var = jnp.square(h - mean).mean(axis=-1, keepdims=True)
            h = (h - mean) * jax.lax.rsqrt(var + 1e-6)
        weights = jax.nn.softmax(s.astype(jnp.float32))  # (L + 1,), sums to 1
        mixed = gamma.astype(jnp.float32) * jnp.einsum("l,bltd->btd", weights, h)  # (B, T, D)
        return nn.with_logical_constraint(mixed.astype(self.dtype),
                                          ("act_batch", "act_len", "act_embed"))


# ---------------------------------------------------------------------------------------------
# Downstream: one classifier over either ELMo or static word2vec features

FEATURE_KINDS = ("elmo", "word2vec")
HEADS = ("pool", "align")


@dataclasses.dataclass(frozen=True)
class FeatureClassifierConfig:
    """A sentence(-pair) classifier over frozen token features.

    Attributes:
      num_classes: labels.
      kind: 'elmo' (the biLM's layers mixed by a trainable ScalarMix) or 'word2vec' (rows of a
        static embedding table). Everything after the features is the same for both.
      bilm: the frozen biLM's config (kind='elmo').
      vocab_size, embed_dim: the static table's shape (kind='word2vec').
      pair: the input is two texts.
      head: 'pool' (each text pooled on its own, PooledEncoder; pairs combined as
        [u; v; |u - v|; u * v], InferSent) or 'align' (pairs only: every token of each text
        attends over the other text's tokens and is compared with what it aligned to, the
        decomposable attention of Parikh et al. 2016, AlignEncoder). Neither looks at word
        order: any order or context a decision needs must be in the features.
      hidden_size: d, the head's width.
      dropout_rate: dropout on the pooled vectors and the hidden layer.
      layer_norm: ScalarMix normalises each layer before mixing (kind='elmo').
    """

    num_classes: int
    kind: str = "elmo"
    bilm: BiLMConfig | None = None
    vocab_size: int = 0
    embed_dim: int = 0
    pair: bool = False
    head: str = "pool"
    hidden_size: int = 64
    dropout_rate: float = 0.0
    layer_norm: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        if self.kind not in FEATURE_KINDS:
            raise ConfigError(f"config.features.kind must be one of {FEATURE_KINDS}, got "
                              f"{self.kind!r}")
        if self.kind == "elmo" and self.bilm is None:
            raise ValueError("FeatureClassifierConfig: kind='elmo' needs the biLM's config (bilm)")
        if self.kind == "word2vec" and min(self.vocab_size, self.embed_dim) < 1:
            raise ValueError(f"FeatureClassifierConfig: kind='word2vec' needs the table's shape, "
                             f"got vocab_size={self.vocab_size}, embed_dim={self.embed_dim}")
        if self.head not in HEADS:
            raise ConfigError(f"config.head.kind must be one of {HEADS}, got {self.head!r}")
        if self.head == "align" and not self.pair:
            raise ConfigError("config.head.kind='align' compares two texts; a single-text task "
                              "needs 'pool'")
        for name in ("num_classes", "hidden_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"FeatureClassifierConfig.{name} must be >= 1, got "
                                  f"{getattr(self, name)}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ConfigError(f"config.head.dropout_rate must be in [0, 1), got "
                              f"{self.dropout_rate}")


class PooledEncoder(nn.Module):
    """A text's vector from its token features: ReLU(x W + b) per token, then the masked mean
    and max over tokens, concatenated: features [B, T, F], mask [B, T] -> [B, 2d]. Pooling
    sees each token on its own, so any context a vector holds comes from the features."""

    hidden_size: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, features: Array, mask: Array) -> Array:
        h = Dense(self.hidden_size, ("embed", "mlp"), dtype=self.dtype,
                  param_dtype=self.param_dtype, name="token")(features)
        h = nn.relu(h).astype(jnp.float32)  # (B, T, d); pooling sums in float32
        m = mask[..., None]  # (B, T, 1)
        count = m.sum(axis=1)  # (B, 1)
        mean = jnp.where(m, h, 0.0).sum(axis=1) / jnp.maximum(count, 1)
        # ReLU outputs are >= 0, so 0 is a safe "empty" max for masked positions / empty texts.
        top = jnp.where(m, h, 0.0).max(axis=1)
        return jnp.concatenate([mean, top], axis=-1).astype(self.dtype)  # (B, 2d)


def _masked_softmax(scores: Array, mask: Array) -> Array:
    """Softmax over the last axis where `mask` is True (float32); empty rows give zeros."""
    scores = jnp.where(mask, scores.astype(jnp.float32), -1e30)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.where(mask, weights, 0.0)


class AlignEncoder(nn.Module):
    """Decomposable attention (Parikh et al. 2016) over two texts' token features:

      attend:    e_ij = F(a_i) . F(b_j), F = ReLU(x W_f + b_f);
                 beta_i = sum_j softmax_j(e_ij) b_j,  alpha_j = sum_i softmax_i(e_ij) a_i
      compare:   v1_i = G([a_i; beta_i; a_i - beta_i; a_i * beta_i]), v2_j likewise,
                 G = ReLU(x W_g + b_g)
      aggregate: [sum_i v1_i; sum_j v2_j]  -> [B, 2d]

    Tokens align by what their features say, not where they stand: a claim's "Zalilmar" finds
    the premise's "Zalilmar", and `compare` sees both vectors, so a context the features carry
    (which relation's words surround the city) decides, while static vectors are identical.
    """

    hidden_size: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, a: Array, mask_a: Array, b: Array, mask_b: Array) -> Array:
        dense = functools.partial(Dense, self.hidden_size, ("embed", "mlp"), dtype=self.dtype,
                                  param_dtype=self.param_dtype)
        attend, compare = dense(name="attend"), dense(name="compare")
        fa, fb = nn.relu(attend(a)), nn.relu(attend(b))  # (B, Ta, d), (B, Tb, d)
        scores = jnp.einsum("bid,bjd->bij", fa, fb, preferred_element_type=jnp.float32)
        pair_mask = mask_a[:, :, None] & mask_b[:, None, :]  # (B, Ta, Tb)
        to_b = _masked_softmax(scores, pair_mask)  # each a_i over b
        to_a = _masked_softmax(jnp.swapaxes(scores, 1, 2), jnp.swapaxes(pair_mask, 1, 2))
        beta = jnp.einsum("bij,bjf->bif", to_b.astype(self.dtype), b)  # (B, Ta, F)
        alpha = jnp.einsum("bji,bif->bjf", to_a.astype(self.dtype), a)  # (B, Tb, F)
        # ESIM's enhancement (Chen et al. 2017): the difference and product make "same word,
        # other context" a direct feature instead of something G must learn to compute.
        v1 = nn.relu(compare(jnp.concatenate([a, beta, a - beta, a * beta], axis=-1)))
        v2 = nn.relu(compare(jnp.concatenate([b, alpha, b - alpha, b * alpha], axis=-1)))
        v1, v2 = v1.astype(jnp.float32), v2.astype(jnp.float32)
        v1 = jnp.where(mask_a[..., None], v1, 0.0).sum(axis=1)  # (B, d)
        v2 = jnp.where(mask_b[..., None], v2, 0.0).sum(axis=1)
        return jnp.concatenate([v1, v2], axis=-1).astype(self.dtype)  # (B, 2d)


class FeatureClassifier(nn.Module):
    """Frozen features -> PooledEncoder (pair: [u; v; |u-v|; u*v]) or AlignEncoder -> ReLU layer
    -> logits.

    Params: 'bilm' (kind='elmo'; frozen) and 'mix' (ScalarMix, trainable), or 'embedding'
    (kind='word2vec', the table (V, D) ('vocab', 'embed'); frozen); then 'encoder', 'hidden',
    'classifier'. The names match the pretraining runs' params ('bilm' of zoo.tasks.elmo,
    'embedding' of zoo.tasks.word2vec), so config.train.init_from restores them. The features
    are wrapped in stop_gradient: the extractor is fixed, as in ELMo's recipe, and its backward
    pass is never computed.
    """

    config: FeatureClassifierConfig

    def setup(self):
        cfg = self.config
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        if cfg.kind == "elmo":
            self.bilm = BiLM(cfg.bilm)
            self.mix = ScalarMix(cfg.bilm.num_layers + 1, layer_norm=cfg.layer_norm,
                                 dtype=dtype, param_dtype=param_dtype)
        else:
            self.embedding = self.param(
                "embedding",
                nn.with_logical_partitioning(nn.initializers.normal(0.1), ("vocab", "embed")),
                (cfg.vocab_size, cfg.embed_dim), param_dtype)
        encoder = AlignEncoder if cfg.head == "align" else PooledEncoder
        self.encoder = encoder(cfg.hidden_size, dtype=dtype, param_dtype=param_dtype)
        self.dropout = nn.Dropout(cfg.dropout_rate)
        self.hidden = Dense(cfg.hidden_size, ("mlp", "embed"), dtype=dtype,
                            param_dtype=param_dtype)
        self.classifier = Dense(cfg.num_classes, ("embed", None), dtype=dtype,
                                param_dtype=param_dtype)

    def features(self, ids: Array, lengths: Array) -> tuple[Array, Array]:
        """Token features [B, T, F] and their mask [B, T] (True at the words) of one text per
        row, ids [B, T] with lengths [B].

        kind='elmo': rows as the biLM reads them (<s> w_1 .. w_n </s> per sentence); the mask
        leaves out the sentence boundaries and the padding. kind='word2vec': rows of words; an
        id outside the table (a word outside the vocabulary) reads a zero vector.
        """
        valid = jnp.arange(ids.shape[1])[None, :] < lengths[:, None]  # (B, T)
        if self.config.kind == "elmo":
            layers = jax.lax.stop_gradient(self.bilm.layers(ids, lengths))  # (B, L+1, T, 2H)
            return self.mix(layers), valid & (ids != BOS_ID) & (ids != EOS_ID)
        table = jax.lax.stop_gradient(self.embedding)
        vectors = jnp.take(table, ids, axis=0, mode="fill", fill_value=0)  # (B, T, D)
        return vectors.astype(jnp.dtype(self.config.dtype)), valid

    def __call__(self, ids_a: Array, lengths_a: Array, ids_b: Array | None = None,
                 lengths_b: Array | None = None, *, deterministic: bool = True) -> Array:
        """Logits [B, num_classes] (float32) of text a (and, for pairs, text b)."""
        if self.config.pair and (ids_b is None or lengths_b is None):
            raise ValueError("FeatureClassifier: a pair model needs ids_b and lengths_b")
        if self.config.head == "align":
            u = self.encoder(*self.features(ids_a, lengths_a),
                             *self.features(ids_b, lengths_b))  # (B, 2d)
        else:
            u = self.encoder(*self.features(ids_a, lengths_a))  # (B, 2d)
            if self.config.pair:
                v = self.encoder(*self.features(ids_b, lengths_b))
                u = jnp.concatenate([u, v, jnp.abs(u - v), u * v], axis=-1)  # (B, 8d)
        h = nn.relu(self.hidden(self.dropout(u, deterministic=deterministic)))
        logits = self.classifier(self.dropout(h, deterministic=deterministic))
        return logits.astype(jnp.float32)
