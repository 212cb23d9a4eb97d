"""Hugging Face GPT-2 <-> zoo GPT (zoo.models.gpt): configs and parameters.

HF GPT-2 stores every projection as a Conv1D whose weight is (in, out), which is already the
orientation of our kernels, so nothing is transposed. The layouts differ in three ways only:

* attn.c_attn fuses q|k|v along its output axis: weight (D, 3D) = [q | k | v], and within each
  block column h*K + k belongs to head h (HF splits heads with a C-order view). Our query, key
  and value kernels are (D, H, K), their biases (H, K).
* attn.c_proj's input axis is the merged heads, h*K + k: weight (D, D) is our out kernel
  (H, K, D).
* Our layers live under h/layer_{i}/ (or, scanned, one h/layers/ subtree with a leading layer
  axis); HF's under h.{i}.

So every HF tensor is the concatenation, along its last axis, of one or more of our tensors
each reshaped in C order: one rule (`_split` / `_join`) serves every row of the tables below.
The output layer is tied to wte in both models: HF's `lm_head.weight` is accepted when it equals
`wte.weight` and written back as a copy of it.

Example:
  model = transformers.GPT2LMHeadModel.from_pretrained(path)
  config = config_from_hf(model.config.to_dict())
  params = params_from_hf(model.state_dict(), config)
  logits = zoo.models.gpt.GPT(config).apply({"params": params}, tokens)
"""

import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from zoo.convert.arrays import listing, to_numpy
from zoo.convert.rename_table import Row
from zoo.errors import DataError
from zoo.models.gpt import GPTConfig
from zoo.models.runtime_fields import RUN_CHOICES

# Shapes are written in symbols resolved from the config (`_dims`): V vocab, P positions, D model
# width, H heads, K head width (D // H), F feed-forward width.
# Rows: (HF name, HF shape, our path(s) that HF concatenates along its last axis, our shape).
_MODEL_TABLE = (
    ("wte.weight", "V D", ("wte/embedding",), "V D"),
    ("wpe.weight", "P D", ("wpe/embedding",), "P D"),
    ("ln_f.weight", "D", ("h/final_norm/scale",), "D"),
    ("ln_f.bias", "D", ("h/final_norm/bias",), "D"),
)
_QKV = ("self_attention/query", "self_attention/key", "self_attention/value")
# Per layer: HF names under h.{i}., ours under h/layer_{i}/ (h/layers/ when scanned).
_LAYER_TABLE = (
    ("ln_1.weight", "D", ("self_attention_norm/scale",), "D"),
    ("ln_1.bias", "D", ("self_attention_norm/bias",), "D"),
    ("attn.c_attn.weight", "D 3D", tuple(f"{p}/kernel" for p in _QKV), "D H K"),
    ("attn.c_attn.bias", "3D", tuple(f"{p}/bias" for p in _QKV), "H K"),
    ("attn.c_proj.weight", "D D", ("self_attention/out/kernel",), "H K D"),
    ("attn.c_proj.bias", "D", ("self_attention/out/bias",), "D"),
    ("ln_2.weight", "D", ("mlp_norm/scale",), "D"),
    ("ln_2.bias", "D", ("mlp_norm/bias",), "D"),
    ("mlp.c_fc.weight", "D F", ("mlp/wi/kernel",), "D F"),
    ("mlp.c_fc.bias", "F", ("mlp/wi/bias",), "F"),
    ("mlp.c_proj.weight", "F D", ("mlp/wo/kernel",), "F D"),
    ("mlp.c_proj.bias", "D", ("mlp/wo/bias",), "D"),
)

_HF_PREFIX = "transformer."
_LM_HEAD = "lm_head.weight"
# Buffers older GPT-2 checkpoints saved next to the parameters (the causal mask and its fill
# value); HF itself ignores them on load.
_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
# Key fragments that identify other families, for a useful error when one is passed by mistake.
_OTHER_FAMILIES = (
    ("BERT", "embeddings.word_embeddings.weight"),
    ("BERT", "attention.self.query.weight"),
    ("T5", "SelfAttention.q.weight"),
    ("Llama-style", "self_attn.q_proj.weight"),
    ("GPT-Neo", "attn.attention.q_proj.weight"),
)

# HF GPT-2 options and the values our GPT implements; anything else changes the function.
_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
_FIXED_OPTIONS = (
    ("activation_function", _TANH_GELUS, "GPT uses the tanh approximation of GELU"),
    ("scale_attn_weights", (True,), "GPT scales attention logits by 1/sqrt(head_dim)"),
    ("scale_attn_by_inverse_layer_idx", (False,), "GPT does not scale logits by layer depth"),
    ("add_cross_attention", (False,), "GPT is decoder-only"),
    ("tie_word_embeddings", (True,), "GPT ties the output layer to wte"),
)


def config_from_hf(hf_config: Mapping[str, Any] | Any, **overrides: Any) -> GPTConfig:
    """The GPTConfig of a Hugging Face GPT-2 config.

    Args:
      hf_config: a GPT-2 config.json as a dict (or a `transformers.GPT2Config`).
      **overrides: the run's choices, which no checkpoint makes
        (zoo.models.runtime_fields.RUN_CHOICES: the dropout rates, the attention kernel, the
        layer scan, remat, the dtypes); every other field comes from the checkpoint.

    Raises:
      ValueError: not a GPT-2 config, or one using an option GPT does not implement.
    """
    hf = dict(hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config)
    model_type = hf.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise DataError(f"config_from_hf: model_type={model_type!r}, not a GPT-2 config")
    required = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
    missing = [k for k in required if k not in hf]
    if missing:
        raise DataError(f"config_from_hf: the GPT-2 config lacks {missing}")
    for field, supported, why in _FIXED_OPTIONS:
        if field in hf and hf[field] not in supported:
            raise DataError(
                f"config_from_hf: {field}={hf[field]!r} is not supported ({why}); "
                f"supported: {list(supported)}"
            )
    bad = sorted(set(overrides) - set(RUN_CHOICES))
    if bad:
        raise ValueError(
            f"config_from_hf: cannot override {bad}: they describe the checkpoint; "
            f"overridable fields are {list(RUN_CHOICES)}"
        )
    resid, embd = hf.get("resid_pdrop", 0.1), hf.get("embd_pdrop", 0.1)
    if resid != embd and "dropout_rate" not in overrides:
        raise DataError(
            f"config_from_hf: resid_pdrop={resid} != embd_pdrop={embd}, but GPT has one "
            "dropout_rate for both; pass dropout_rate=... to choose"
        )
    d, heads = hf["n_embd"], hf["n_head"]
    if d % heads:
        raise DataError(f"config_from_hf: n_embd={d} is not divisible by n_head={heads}")
    kw = dict(
        vocab_size=hf["vocab_size"],
        max_len=hf["n_positions"],
        num_layers=hf["n_layer"],
        num_heads=heads,
        embed_dim=d,
        mlp_dim=hf.get("n_inner") or 4 * d,  # HF's None means 4 * n_embd
        dropout_rate=resid,
        attention_dropout_rate=hf.get("attn_pdrop", 0.1),
        layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-5),
        initializer_range=hf.get("initializer_range", 0.02),
    )
    kw.update(overrides)
    return GPTConfig(**kw)


def config_to_hf(config: GPTConfig, **extra: Any) -> dict[str, Any]:
    """The Hugging Face GPT-2 config dict (for `transformers.GPT2Config(**d)`) of `config`.

    Args:
      config: our model config.
      **extra: more HF fields, e.g. bos_token_id / eos_token_id from the tokenizer (HF's
        defaults, 50256, are GPT-2's own and lie outside smaller vocabularies).
    """
    if config.embed_dim % config.num_heads:
        raise ValueError(
            f"config_to_hf: embed_dim={config.embed_dim} is not divisible by "
            f"num_heads={config.num_heads}"
        )
    hf = dict(
        model_type="gpt2",
        architectures=["GPT2LMHeadModel"],
        vocab_size=config.vocab_size,
        n_positions=config.max_len,
        n_embd=config.embed_dim,
        n_layer=config.num_layers,
        n_head=config.num_heads,
        n_inner=config.mlp_dim,
        activation_function="gelu_new",
        resid_pdrop=config.dropout_rate,
        embd_pdrop=config.dropout_rate,
        attn_pdrop=config.attention_dropout_rate,
        layer_norm_epsilon=config.layer_norm_epsilon,
        initializer_range=config.initializer_range,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
        add_cross_attention=False,
        tie_word_embeddings=True,
        dtype=config.param_dtype,
    )
    hf.update(extra)
    return hf


def _dims(config: GPTConfig) -> dict[str, int]:
    d = config.embed_dim
    return dict(
        V=config.vocab_size, P=config.max_len, D=d, H=config.num_heads,
        K=d // config.num_heads, F=config.mlp_dim, **{"3D": 3 * d},
    )


def _rows(config: GPTConfig) -> list[Row]:
    """The tables instantiated for `config`: concrete names, paths and shapes."""
    dims = _dims(config)

    def shape(spec):
        return tuple(dims[s] for s in spec.split())

    rows = [Row(hf, shape(hs), ours, shape(os_), None) for hf, hs, ours, os_ in _MODEL_TABLE]
    for i in range(config.num_layers):
        prefix = "h/layers" if config.scan_layers else f"h/layer_{i}"
        rows += [
            Row(f"h.{i}.{hf}", shape(hs), tuple(f"{prefix}/{p}" for p in ours), shape(os_), i)
            for hf, hs, ours, os_ in _LAYER_TABLE
        ]
    return rows


def _split(x: np.ndarray, row: Row) -> list[np.ndarray]:
    """HF tensor -> our tensors: split the last axis into len(row.ours) parts, reshape each."""
    return [part.reshape(row.our_shape) for part in np.split(x, len(row.ours), axis=-1)]


def _join(parts: list[np.ndarray], row: Row) -> np.ndarray:
    """Our tensors -> the HF tensor: `_split` inverted (always a fresh array)."""
    part_shape = row.hf_shape[:-1] + (row.hf_shape[-1] // len(parts),)
    return np.concatenate([p.reshape(part_shape) for p in parts], axis=-1)





def _strip_prefix(names: list[str]) -> tuple[dict[str, str], str]:
    """(bare name -> given name, the prefix), for GPT2LMHeadModel or GPT2Model keys."""
    body = [n for n in names if n != _LM_HEAD]
    prefixed = [n for n in body if n.startswith(_HF_PREFIX)]
    if prefixed and len(prefixed) != len(body):
        bare = [n for n in body if not n.startswith(_HF_PREFIX)]
        raise DataError(
            f"params_from_hf: the state dict mixes '{_HF_PREFIX}'-prefixed names "
            f"({listing(prefixed, 3)}) with bare ones ({listing(bare, 3)}); pass the state "
            "dict of one model (GPT2LMHeadModel or GPT2Model)"
        )
    prefix = _HF_PREFIX if prefixed else ""
    return {n[len(prefix):]: n for n in body}, prefix


def _check_is_gpt2(bare: Mapping[str, str], expected: set[str]) -> None:
    if expected & set(bare):
        return
    for family, fragment in _OTHER_FAMILIES:
        hits = [given for given in bare.values() if fragment in given]
        if hits:
            raise DataError(
                f"params_from_hf: this is not a GPT-2 checkpoint: it looks like {family} "
                f"(key {hits[0]!r}); use that family's converter"
            )
    raise DataError(
        "params_from_hf: this is not a GPT-2 checkpoint: none of its keys is a GPT-2 parameter "
        f"name (expected e.g. wte.weight, h.0.attn.c_attn.weight); its keys: "
        f"{listing(bare.values(), 8) or '(none)'}"
    )


def params_from_hf(state_dict: Mapping[str, Any], config: GPTConfig) -> dict[str, Any]:
    """Our GPT params pytree from a Hugging Face GPT-2 state dict.

    Args:
      state_dict: name -> numpy array or torch tensor, from GPT2LMHeadModel ('transformer.'
        prefix, optional tied 'lm_head.weight') or GPT2Model (bare names). Older checkpoints'
        attention buffers (h.{i}.attn.bias / masked_bias) are ignored.
      config: the model to load into (e.g. from `config_from_hf`); its scan_layers picks the
        unscanned (h/layer_{i}) or scanned (h/layers, leading layer axis) layout.

    Returns:
      Nested dict of numpy arrays in config.param_dtype, to use as {"params": ...}.

    Raises:
      ValueError: not a GPT-2 checkpoint, missing or unexpected keys, a shape that does not fit
        `config`, or an lm_head that is not tied to wte.
    """
    given = {
        k: v for k, v in state_dict.items() if not _BUFFERS.fullmatch(k.removeprefix(_HF_PREFIX))
    }
    bare, prefix = _strip_prefix(list(given))
    rows = _rows(config)
    expected = {row.hf for row in rows}
    _check_is_gpt2(bare, expected)
    missing, unexpected = expected - set(bare), set(bare) - expected
    if missing or unexpected:
        lines = [f"params_from_hf: the state dict does not fit a {config.num_layers}-layer GPT-2"]
        if missing:
            lines.append(f"  missing keys: {listing(prefix + k for k in missing)}")
        if unexpected:
            lines.append(f"  unexpected keys: {listing(bare[k] for k in unexpected)}")
        lines.append("  Build the config from the checkpoint's own with config_from_hf.")
        raise DataError("\n".join(lines))

    dtype = jnp.dtype(config.param_dtype)
    flat: dict[str, Any] = {}
    layers: dict[str, list[np.ndarray]] = {}
    for row in rows:
        x = to_numpy(given[bare[row.hf]])
        if x.shape != row.hf_shape:
            raise DataError(
                f"params_from_hf: {bare[row.hf]!r} has shape {x.shape} but the config needs "
                f"{row.hf_shape}; build the config with config_from_hf"
            )
        for path, part in zip(row.ours, _split(x, row)):
            part = part.astype(dtype)  # a copy: the result never aliases the torch tensors
            if config.scan_layers and row.layer is not None:
                layers.setdefault(path, []).append(part)
            else:
                flat[path] = part
    # Scanned: rows come in layer order, so stacking gives the leading layer axis.
    flat.update({path: np.stack(parts) for path, parts in layers.items()})

    if _LM_HEAD in given:
        head, wte = to_numpy(given[_LM_HEAD]), flat["wte/embedding"]
        if head.shape != wte.shape or not np.array_equal(head.astype(dtype), wte):
            raise DataError(
                f"params_from_hf: {_LM_HEAD!r} differs from wte.weight: the checkpoint has an "
                "untied output layer, which GPT (output tied to wte) cannot represent"
            )
    return traverse_util.unflatten_dict(flat, sep="/")


def params_to_hf(params: Mapping[str, Any], config: GPTConfig, *,
                 lm_head: bool = True) -> dict[str, np.ndarray]:
    """A Hugging Face GPT-2 state dict (numpy, Conv1D layout, fused c_attn) from our params.

    Args:
      params: our GPT params (boxed or not; a {"params": ...} variables dict is unwrapped).
      config: their config; scan_layers says which layout they are in.
      lm_head: True for GPT2LMHeadModel's names ('transformer.' prefix plus the tied
        'lm_head.weight', a copy of wte), False for GPT2Model's bare names.

    Returns:
      HF name -> numpy array in the params' dtype, for `torch.from_numpy` + `load_state_dict`,
      or for `safetensors.numpy.save_file` beside a config.json from `config_to_hf`, which
      `from_pretrained` reads (HF's own files omit the tied lm_head.weight; both load).

    Raises:
      ValueError: missing or unexpected params, or a shape that does not fit `config`.
    """
    params = nn.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    flat = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params, sep="/").items()}
    rows = _rows(config)
    expected = {path for row in rows for path in row.ours}
    missing, unexpected = expected - set(flat), set(flat) - expected
    if missing or unexpected:
        layout = "scanned (h/layers)" if config.scan_layers else "unscanned (h/layer_{i})"
        header = (
            f"params_to_hf: the params do not fit the config (a {config.num_layers}-layer GPT, "
            f"{layout}; is config.scan_layers right?)"
        )
        lines = [header]
        if missing:
            lines.append(f"  missing params: {listing(missing)}")
        if unexpected:
            lines.append(f"  unexpected params: {listing(unexpected)}")
        raise ValueError("\n".join(lines))

    out = {}
    for row in rows:
        parts = []
        for path in row.ours:
            x = flat[path]
            stacked = config.scan_layers and row.layer is not None
            want = ((config.num_layers,) if stacked else ()) + row.our_shape
            if x.shape != want:
                raise ValueError(
                    f"params_to_hf: param {path!r} has shape {x.shape} but the config needs {want}"
                )
            parts.append(x[row.layer] if stacked else x)
        out[row.hf] = _join(parts, row)
    if not lm_head:
        return out
    out = {_HF_PREFIX + name: x for name, x in out.items()}
    out[_LM_HEAD] = out[_HF_PREFIX + "wte.weight"].copy()
    return out
