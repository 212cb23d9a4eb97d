"""What `benchmarks.scaling` runs for each model name: the zoo layer (`build_model`), its
parameters (`init_params`), the jitted forward or forward+backward (`make_fn`), and whether
this machine can run it at all (`unavailable_models`, with the reason recorded)."""

from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from benchmarks import peers
from benchmarks import scaling_analysis as analysis
from zoo.nn.attention import MultiHeadAttention
from zoo.nn.masks import MaskSpec
from zoo.nn.recurrent import RNN
from zoo.nn.transformer import EncoderLayer

# --dtype's names.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class LocalAttention(nn.Module):
    """Self-attention over the `window` keys either side of each query, blockwise."""

    num_heads: int
    window: int
    block: int
    dtype: object = jnp.float32

    @nn.compact
    def __call__(self, x):
        return MultiHeadAttention(num_heads=self.num_heads, backend="blockwise",
                                  block_q=self.block, block_k=self.block, dtype=self.dtype,
                                  name="attention")(
            x, mask=MaskSpec.self_attention(window=self.window))


def build_model(model: str, d: int, heads: int, kernel: int, dtype, *, block: int = 512,
                window: int = analysis.LOCAL_WINDOW) -> tuple[nn.Module, Callable]:
    """The zoo layer for `model` and the function picking its output array from `apply`'s."""
    if model == "attention_local":
        return LocalAttention(heads, window, block, dtype), lambda y: y
    if model in analysis.ATTENTION_MODELS:
        backend = model.removeprefix("attention_")
        return MultiHeadAttention(num_heads=heads, backend=backend, block_q=block, block_k=block,
                                  dtype=dtype), lambda y: y
    if model in analysis.RECURRENT_MODELS:
        return RNN(hidden_size=d, cell=model, dtype=dtype), lambda y: y[0]  # (outputs, carry)
    if model == "lstm_fused":
        return RNN(hidden_size=d, cell="lstm", dtype=dtype, backend="cpu_fused"), lambda y: y[0]
    if model == "conv":
        return nn.Conv(d, (kernel,), padding="SAME", dtype=dtype), lambda y: y
    if model == "encoder_layer":
        return (EncoderLayer(num_heads=heads, mlp_dim=analysis.MLP_RATIO * d, dtype=dtype),
                lambda y: y)
    raise ValueError(f"model={model!r} is not one of {analysis.MODELS}")


def init_params(module: nn.Module, d: int, dtype):
    """Parameters from a fixed key; they depend on d only, so one init serves every n. Jitted:
    eager init would compile each of its many small ops on its own."""
    return jax.jit(module.init)(jax.random.key(0), jnp.zeros((1, 2, d), dtype))


def make_fn(module: nn.Module, extract: Callable, pass_: str) -> Callable:
    """jit(forward) or jit(grad of 0.5 * sum(outputs^2) in float32 w.r.t. (params, inputs))."""

    def forward(params, x):
        return extract(module.apply(params, x))

    if pass_ == "forward":
        return jax.jit(forward)

    def loss(params, x):
        # Sum of squares, not the plain sum: d(sum y)/dy = 1 needs no y, so for a linear layer
        # (the convolution) XLA would drop the forward pass from the program as dead code.
        return 0.5 * jnp.sum(jnp.square(forward(params, x).astype(jnp.float32)))

    return jax.jit(jax.grad(loss, argnums=(0, 1)))


def unavailable_models(models: Sequence[str], dtype) -> dict[str, str]:
    """Models this machine cannot run, with the reason: the cuDNN kernel (GPU, bf16/fp16), the
    fused CPU LSTM (a CPU, float32) and the torch RNNs (the 'parity' extra; float32)."""
    platform = jax.devices()[0].platform
    out = {}
    if "lstm_fused" in models and (platform != "cpu" or dtype != jnp.float32):
        out["lstm_fused"] = (f"the fused LSTM kernel runs on a CPU in float32 only; this run is "
                             f"{platform}, {jnp.dtype(dtype).name}")
    torch_models = [m for m in analysis.TORCH_MODELS if m in models]
    if torch_models:
        reason = peers.unavailable_reason(platform)
        if reason is None and dtype != jnp.float32:
            reason = "the torch RNNs are timed in float32 only; run with --dtype float32"
        out.update({m: reason for m in torch_models if reason})
    if "attention_cudnn" not in models:
        return out
    if platform != "gpu":
        return {**out, "attention_cudnn": f"cuDNN flash attention needs a GPU; the backend is "
                                          f"{platform}"}
    if dtype not in (jnp.bfloat16, jnp.float16):
        return {**out, "attention_cudnn": "cuDNN flash attention takes bfloat16/float16 only; "
                                          "run with --dtype bfloat16"}
    try:
        q = jnp.zeros((1, 128, 1, 64), dtype)
        jax.block_until_ready(jax.nn.dot_product_attention(q, q, q, implementation="cudnn"))
    except Exception as error:  # jax raises several types for a missing/unsupported kernel
        out["attention_cudnn"] = (f"cuDNN attention failed on a tiny input: "
                                  f"{str(error).splitlines()[0][:200]}")
    return out
