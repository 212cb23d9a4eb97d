"""Transformer layers (encoder, decoder) and the stacks that repeat them.

Every sublayer (self-attention, cross-attention, feed-forward) is wrapped in a residual with
LayerNorm placed one of two ways:

* norm_position='post': x = LN(x + dropout(f(x))) — the original Transformer and BERT.
* norm_position='pre':  x = x + dropout(f(LN(x))) — GPT-2; the stack then ends with a final
  LayerNorm (GPT-2's ln_f), since the residual stream itself is never normalised.

Masks are built once at the top of the model (zoo.nn.masks) and passed down unchanged.

Parameter names inside a layer: self_attention, self_attention_norm, [cross_attention,
cross_attention_norm,] mlp (wi, wo), mlp_norm. Unscanned stacks name their layers layer_0,
layer_1, ...; scanned stacks hold one 'layers' subtree whose parameters carry a leading
num_layers axis (logical name 'layers'), so converting between the two is a stack/unstack.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.nn.attention import MultiHeadAttention
from zoo.nn.feedforward import FeedForward, get_activation
from zoo.nn.linear import default_kernel_init
from zoo.nn.normalization import LayerNorm

Dtype = Any
Initializer = Any

_EMBED_AXES = ("act_batch", "act_len", "act_embed")
_NORM_POSITIONS = ("post", "pre")
_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _check_layer_args(name: str, norm_position: str, activation: str) -> None:
    if norm_position not in _NORM_POSITIONS:
        raise ConfigError(f"{name}: norm_position={norm_position!r}; use one of {_NORM_POSITIONS}")
    get_activation(activation)  # raises a ValueError naming the choices


def _residual(
    layer: nn.Module,
    x: jnp.ndarray,
    sublayer: Callable[[jnp.ndarray], jnp.ndarray],
    norm_name: str,
    deterministic: bool,
) -> jnp.ndarray:
    """One residual sublayer with `layer`'s LayerNorm placement and residual dropout."""
    norm = LayerNorm(
        epsilon=layer.layer_norm_epsilon,
        dtype=layer.dtype,
        param_dtype=layer.param_dtype,
        name=norm_name,
    )
    drop = nn.Dropout(layer.dropout_rate)
    if layer.norm_position == "pre":
        return x + drop(sublayer(norm(x)), deterministic=deterministic)
    return norm(x + drop(sublayer(x), deterministic=deterministic))


class LayerSettings(nn.Module):
    """The attributes every layer and stack below is configured by, declared once: EncoderLayer,
    DecoderLayer and both stacks inherit them, and a stack hands its values to its layers.
    All but num_heads and mlp_dim are keyword-only.

    Attributes:
      num_heads: attention heads.
      mlp_dim: feed-forward hidden width.
      head_dim: width per head; default model width // num_heads.
      activation: feed-forward activation, 'gelu' (erf, BERT), 'gelu_tanh' (GPT-2) or 'relu'.
      dropout_rate: residual dropout on every sublayer's output.
      attention_dropout_rate: dropout on the attention weights.
      mlp_dropout_rate: dropout on the feed-forward hidden activations (0 in BERT and GPT-2).
      layer_norm_epsilon: LayerNorm epsilon (BERT 1e-12, GPT-2 1e-5, Transformer 1e-6).
      norm_position: 'post' (Transformer, BERT) or 'pre' (GPT-2).
      backend: attention backend, as MultiHeadAttention.backend ('einsum', 'blockwise', ...).
      attention_block: query / key block size of the blockwise and Pallas backends.
      use_bias: biases in the attention and feed-forward projections.
      dtype, param_dtype: compute and parameter dtypes.
      kernel_init: initializer of every projection kernel.
      out_kernel_init: initializer of the kernels that write into the residual stream (the
        attention output and the feed-forward `wo`); None = kernel_init.
    """

    num_heads: int
    mlp_dim: int
    _: dataclasses.KW_ONLY
    head_dim: int | None = None
    activation: str = "gelu"
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    mlp_dropout_rate: float = 0.0
    layer_norm_epsilon: float = 1e-6
    norm_position: str = "post"
    backend: str = "einsum"
    attention_block: int = 512
    use_bias: bool = True
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init
    out_kernel_init: Initializer | None = None


class DecoderSettings(LayerSettings):
    """LayerSettings plus what only a decoder has (DecoderLayer and TransformerDecoder).

    Attributes:
      cross_attention: attend over the encoder output `encoded` after self-attention; False for
        a decoder-only (GPT) block.
      decode: KV-cache decoding in the self-attention (see MultiHeadAttention.decode): `init`
        with a full-length input sizes the cache, each later call feeds the next token(s).
    """

    _: dataclasses.KW_ONLY
    cross_attention: bool = True
    decode: bool = False


class EncoderLayer(LayerSettings):
    """Self-attention then feed-forward, each in a residual (post-LN or pre-LN); attributes are
    LayerSettings'."""

    @nn.compact
    def __call__(
        self,
        x: jnp.ndarray,
        mask: jnp.ndarray | None = None,
        *,
        deterministic: bool = True,
        sow_weights: bool = False,
    ) -> jnp.ndarray:
        """x [b, t, d], mask bool [b, 1, t, t] (True = attend) or a MaskSpec -> [b, t, d]."""
        _check_layer_args("EncoderLayer", self.norm_position, self.activation)
        x = nn.with_logical_constraint(x, _EMBED_AXES)

        def self_attention(h):
            return MultiHeadAttention(
                num_heads=self.num_heads,
                head_dim=self.head_dim,
                dropout_rate=self.attention_dropout_rate,
                use_bias=self.use_bias,
                backend=self.backend,
                block_q=self.attention_block,
                block_k=self.attention_block,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                kernel_init=self.kernel_init,
                out_kernel_init=self.out_kernel_init,
                name="self_attention",
            )(h, mask=mask, deterministic=deterministic, sow_weights=sow_weights)

        x = _residual(self, x, self_attention, "self_attention_norm", deterministic)
        x = _residual(self, x, _mlp(self, deterministic), "mlp_norm", deterministic)
        return nn.with_logical_constraint(x, _EMBED_AXES)


class DecoderLayer(DecoderSettings):
    """Masked self-attention, optional cross-attention to the encoder, feed-forward; with
    cross_attention=False a decoder-only (GPT) block. Attributes are DecoderSettings'."""

    @nn.compact
    def __call__(
        self,
        x: jnp.ndarray,
        encoded: jnp.ndarray | None = None,
        *,
        self_mask: jnp.ndarray | None = None,
        cross_mask: jnp.ndarray | None = None,
        deterministic: bool = True,
        sow_weights: bool = False,
    ) -> jnp.ndarray:
        """Decodes x [b, t, d] attending over encoded [b, s, d_enc].

        Args:
          x: decoder inputs [b, t, d].
          encoded: encoder output [b, s, d_enc]; required iff cross_attention.
          self_mask: bool [b, 1, t, t] or a MaskSpec, normally causal & padding. In decode mode
            the cache adds the causal part itself; pass None, a [b, 1, 1, max_len] padding
            mask, or a MaskSpec carrying only a local window.
          cross_mask: bool [b, 1, t, s] or a MaskSpec (decoder query validity & encoder
            padding).
          deterministic: no dropout when True.
          sow_weights: store attention weights in 'intermediates'.
        """
        _check_layer_args("DecoderLayer", self.norm_position, self.activation)
        if self.cross_attention and encoded is None:
            raise ValueError(
                "DecoderLayer: cross_attention=True needs the encoder output `encoded`; pass it, "
                "or set cross_attention=False for a decoder-only model"
            )
        if not self.cross_attention and encoded is not None:
            raise ValueError(
                "DecoderLayer: got `encoded` but cross_attention=False; set cross_attention=True "
                "to attend over it, or do not pass it"
            )
        x = nn.with_logical_constraint(x, _EMBED_AXES)
        attention = dict(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            dropout_rate=self.attention_dropout_rate,
            use_bias=self.use_bias,
            backend=self.backend,
            block_q=self.attention_block,
            block_k=self.attention_block,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            out_kernel_init=self.out_kernel_init,
        )

        def self_attention(h):
            return MultiHeadAttention(decode=self.decode, name="self_attention", **attention)(
                h, mask=self_mask, deterministic=deterministic, sow_weights=sow_weights
            )

        def cross_attention(h):
            return MultiHeadAttention(name="cross_attention", **attention)(
                h, encoded, mask=cross_mask, deterministic=deterministic, sow_weights=sow_weights
            )

        x = _residual(self, x, self_attention, "self_attention_norm", deterministic)
        if self.cross_attention:
            x = _residual(self, x, cross_attention, "cross_attention_norm", deterministic)
        x = _residual(self, x, _mlp(self, deterministic), "mlp_norm", deterministic)
        return nn.with_logical_constraint(x, _EMBED_AXES)


def _mlp(layer: nn.Module, deterministic: bool) -> Callable[[jnp.ndarray], jnp.ndarray]:
    def mlp(h):
        return FeedForward(
            mlp_dim=layer.mlp_dim,
            activation=layer.activation,
            dropout_rate=layer.mlp_dropout_rate,
            use_bias=layer.use_bias,
            dtype=layer.dtype,
            param_dtype=layer.param_dtype,
            kernel_init=layer.kernel_init,
            out_kernel_init=layer.out_kernel_init,
            name="mlp",
        )(h, deterministic=deterministic)

    return mlp


def _layer_fields(stack: nn.Module, layer_cls: type) -> dict:
    """The stack's values for every attribute its layers share (all but Linen's own fields)."""
    return {
        f.name: getattr(stack, f.name)
        for f in dataclasses.fields(layer_cls)
        if f.init and f.name not in ("parent", "name")
    }


def _run_stack(
    stack: nn.Module,
    make_layer: Callable[[str], nn.Module],
    body: Callable[..., jnp.ndarray],
    x: jnp.ndarray,
    *broadcast_args,
) -> jnp.ndarray:
    """Applies `body(layer, x, *broadcast_args)` num_layers times, scanned and/or rematerialised.

    `body` closes over the Python-level flags (deterministic, sow_weights), so neither remat nor
    scan has to treat them as static arguments.
    """
    if stack.remat != "none":
        if stack.remat not in _REMAT_POLICIES:
            raise ConfigError(
                f"{type(stack).__name__}: remat={stack.remat!r}; use 'none' or one of "
                f"{sorted(_REMAT_POLICIES)}"
            )
        # Inside a scan the loop boundary already stops XLA from merging the recomputation
        # with the forward pass, so remat's own CSE barrier is only needed when unrolled.
        body = nn.remat(
            body, policy=_REMAT_POLICIES[stack.remat], prevent_cse=not stack.scan_layers
        )
    if not stack.scan_layers:
        for i in range(stack.num_layers):
            x = body(make_layer(f"layer_{i}"), x, *broadcast_args)
        return x

    def scan_body(layer, carry, *args):
        return body(layer, carry, *args), None

    scanned = nn.scan(
        scan_body,
        variable_axes={"params": 0, "cache": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * len(broadcast_args),
        length=stack.num_layers,
        # Layers per loop iteration: -1 all (straight-line code over the same stacked params),
        # 0 (config 'auto' that nobody settled) and 1 one compiled layer.
        unroll=stack.num_layers if stack.scan_unroll == -1 else max(1, stack.scan_unroll),
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
    x, _ = scanned(make_layer("layers"), x, *broadcast_args)
    return x


def _final_norm(stack: nn.Module, x: jnp.ndarray) -> jnp.ndarray:
    if stack.norm_position != "pre":
        return x
    x = LayerNorm(
        epsilon=stack.layer_norm_epsilon,
        dtype=stack.dtype,
        param_dtype=stack.param_dtype,
        name="final_norm",
    )(x)
    return nn.with_logical_constraint(x, _EMBED_AXES)


class TransformerEncoder(LayerSettings):
    """num_layers EncoderLayers, plus a final LayerNorm when norm_position='pre'.

    Attributes (and LayerSettings'):
      num_layers: depth.
      scan_layers: run the layers with nn.scan over parameters stacked on a leading 'layers'
        axis (one compiled layer instead of num_layers copies).
      scan_unroll: layers per iteration of that scan; -1 = all of them, straight-line code
        over the same stacked parameters (on a CPU 6-11% off a GPT step: the loop's slicing
        and stacking of each layer's weights and residuals goes; on a TPU it multiplies
        compile time). zoo.train.layer_scan settles config.model.scan_unroll=0 ('auto').
      remat: 'none', 'full' (recompute everything in the backward pass) or 'dots' (keep the
        matmul outputs without batch dims, recompute the rest).
    """

    num_layers: int
    scan_layers: bool = False
    scan_unroll: int = 1
    remat: str = "none"

    @nn.compact
    def __call__(
        self,
        x: jnp.ndarray,
        mask: jnp.ndarray | None = None,
        *,
        deterministic: bool = True,
        sow_weights: bool = False,
    ) -> jnp.ndarray:
        """x [b, t, d], mask bool [b, 1, t, t] or a MaskSpec -> [b, t, d]."""
        _check_layer_args("TransformerEncoder", self.norm_position, self.activation)

        def make_layer(name):
            return EncoderLayer(**_layer_fields(self, EncoderLayer), name=name)

        def body(layer, h, mask):
            return layer(h, mask, deterministic=deterministic, sow_weights=sow_weights)

        x = _run_stack(self, make_layer, body, x, mask)
        return _final_norm(self, x)


class TransformerDecoder(DecoderSettings):
    """num_layers DecoderLayers, plus a final LayerNorm when norm_position='pre' (GPT-2 ln_f).

    Attributes (and DecoderSettings'): num_layers, scan_layers, scan_unroll, remat as
    TransformerEncoder.
    """

    num_layers: int
    scan_layers: bool = False
    scan_unroll: int = 1
    remat: str = "none"

    @nn.compact
    def __call__(
        self,
        x: jnp.ndarray,
        encoded: jnp.ndarray | None = None,
        *,
        self_mask: jnp.ndarray | None = None,
        cross_mask: jnp.ndarray | None = None,
        deterministic: bool = True,
        sow_weights: bool = False,
    ) -> jnp.ndarray:
        """x [b, t, d], encoded [b, s, d_enc] or None -> [b, t, d]; masks as DecoderLayer."""
        _check_layer_args("TransformerDecoder", self.norm_position, self.activation)

        def make_layer(name):
            return DecoderLayer(**_layer_fields(self, DecoderLayer), name=name)

        def body(layer, h, encoded, self_mask, cross_mask):
            return layer(
                h,
                encoded,
                self_mask=self_mask,
                cross_mask=cross_mask,
                deterministic=deterministic,
                sow_weights=sow_weights,
            )

        x = _run_stack(self, make_layer, body, x, encoded, self_mask, cross_mask)
        return _final_norm(self, x)


# Backends that keep the [heads, q, k] softmax output for the backward pass; the others keep
# one log-sum-exp per query and head and recompute the weights (zoo.nn.blockwise_attention).
KEEPS_ATTENTION_WEIGHTS = ("einsum", "dot_product")


def stack_activation_bytes(batch: int, seq_len: int, hidden: int, heads: int, layers: int,
                           mlp: int, dtype_bytes: int, remat: str,
                           tensor_parallel: int = 1, backend: str = "einsum") -> float:
    """Activation memory kept for the backward pass of a Transformer stack on one device.

    Per layer and token without recomputation (Korthikanti et al. 2022, eq. 2, for any mlp
    width and element size): 6 * hidden elements stay whole on every device (the layer input,
    two LayerNorm inputs, the FFN input, two dropout masks) and 4 * hidden + 2 * mlp +
    2 * heads * seq_len are split by tensor parallelism (q, k, v, attention output, FFN hidden
    and activation, softmax output and its dropout mask). 'full' remat keeps only each layer's
    input and recomputes one layer at a time; 'dots' keeps the matmul outputs. An attention
    backend that recomputes the weights (not in KEEPS_ATTENTION_WEIGHTS) keeps `heads`
    log-sum-exps per token instead of 2 * heads * seq_len weights.
    """
    t = tensor_parallel
    scores = 2 * heads * seq_len if backend in KEEPS_ATTENTION_WEIGHTS else heads
    full_layer = 6 * hidden + (4 * hidden + 2 * mlp + scores) / t
    per_token = {
        "none": full_layer,
        "dots": hidden + (4 * hidden + mlp) / t,
        "full": hidden,
    }[remat]
    total = per_token * layers
    if remat == "full":  # plus the one layer being recomputed
        total += full_layer
    # The backward pass of a layer holds the gradients of its activations (as large as the
    # activations themselves) while the stored ones are still live.
    total += full_layer
    return float(batch * seq_len * total * dtype_bytes)
