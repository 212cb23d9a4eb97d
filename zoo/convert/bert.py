"""Hugging Face and google-research/bert <-> zoo BERT (zoo.models.bert): configs and parameters.
The configs' half is zoo.convert.bert_config (its three functions are importable from here).

Three layouts of the same tensors (Hugging Face, google-research/bert TensorFlow, ours), one
table: zoo.convert.bert_tables names every tensor in each and says how their layouts differ.

LayerNorm gain/shift are `weight`/`bias` in HF (`gamma`/`beta` in old HF files, accepted),
`gamma`/`beta` in TF, `scale`/`bias` ours. Our encoder layers live under encoder/layer_{i}/
(or, scanned, one encoder/layers/ subtree with a leading layer axis).

The MLM decoder is tied to the word embeddings in all three: HF's state dict repeats it as
`cls.predictions.decoder.weight` (and the output bias as `cls.predictions.decoder.bias`); both
are accepted when equal to what they repeat and written back as copies.

Heads (the `heads` argument): 'pretraining' (True; HF cls.*, TF cls/predictions,
cls/seq_relationship), 'question_answering' (HF qa_outputs.*, TF cls/squad/*) or
'sequence_classification' (HF classifier.*, TF the root output_weights / output_bias, with
num_labels rows); False means BertModel. Head models hold the encoder under bert/ in our params.
HF's BertForQuestionAnswering has no pooler (add_pooling_layer=False) while ours computes one
(its params are BertModel's): importing such a checkpoint fills the pooler with zeros (the span
head never reads it) and exporting one leaves the pooler out.

Example:
  hf_model = transformers.BertForPreTraining.from_pretrained(path)
  config = config_from_hf(hf_model.config)
  params = params_from_hf(hf_model.state_dict(), config)
  mlm, nsp = zoo.models.bert.BertForPreTraining(config).apply(
      {"params": params}, ids, types, mask, masked_positions)
"""

import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from zoo.convert import bert_tables as tables
from zoo.convert.arrays import listing, to_numpy
from zoo.convert.bert_config import config_from_hf, config_to_hf, num_labels_from_hf
from zoo.convert.bert_tables import HEADS
from zoo.errors import DataError
from zoo.models.bert import BertConfig

__all__ = ["TF_OPTIMIZER_VARIABLES", "config_from_hf", "config_to_hf", "num_labels_from_hf",
           "params_from_hf", "params_from_tf_variables", "params_to_hf", "params_to_tf_variables"]

# HF's BertForQuestionAnswering is built without the pooler (see the module docstring).
_HF_QA_ABSENT = ("pooler.dense.weight", "pooler.dense.bias")

# HF's copies of tied tensors: (the copy, the HF name it must equal, less any 'bert.' prefix).
_HF_TIED = (
    ("cls.predictions.decoder.weight", "embeddings.word_embeddings.weight"),
    ("cls.predictions.decoder.bias", "cls.predictions.bias"),
)
# Buffers some HF versions saved with the parameters (arange / zeros); HF ignores them on load.
_HF_BUFFERS = re.compile(r"(bert\.)?embeddings\.(position_ids|token_type_ids)")
# TF checkpoints written during training also hold optimizer slots and the step counter
# (google-research/bert's AdamWeightDecay: adam_m/adam_v; TF1 Adam: Adam/Adam_1/beta*_power).
TF_OPTIMIZER_VARIABLES = re.compile(
    r".*/adam_[mv]|.*/Adam(_1)?|global_step|beta[12]_power")
# Key fragments that identify other families, for a useful error when one is passed by mistake.
_OTHER_FAMILIES = (
    ("GPT-2", "attn.c_attn.weight", "zoo.convert.gpt2"),
    ("GPT-2", "wte.weight", "zoo.convert.gpt2"),
    ("RoBERTa", "roberta.embeddings", None),
    ("T5", "SelfAttention.q.weight", None),
    ("Llama-style", "self_attn.q_proj.weight", None),
)

def _check_is_bert(given: Mapping[str, Any], expected: set[str], fmt: str) -> None:
    if expected & set(given):
        return
    for family, fragment, converter in _OTHER_FAMILIES:
        hits = [name for name in given if fragment in name]
        if hits:
            use = converter or "that family's converter"
            raise DataError(
                f"{_FROM[fmt]}: this is not a BERT checkpoint: it looks like {family} "
                f"(key {hits[0]!r}); use {use}"
            )
    example = ("bert.embeddings.word_embeddings.weight, encoder.layer.0.attention.self.query.weight"
               if fmt == "hf" else
               "bert/embeddings/word_embeddings, bert/encoder/layer_0/attention/self/query/kernel")
    raise DataError(
        f"{_FROM[fmt]}: this is not a BERT checkpoint: none of its keys is a BERT parameter "
        f"name (expected e.g. {example}); its keys: {listing(given, 8) or '(none)'}"
    )


_FROM = {"hf": "params_from_hf", "tf": "params_from_tf_variables"}
_TO = {"hf": "params_to_hf", "tf": "params_to_tf_variables"}
# What each head kind builds; "none" is BertModel (the encoder alone, at the params' root).
_MODELS = {"none": "BertModel",
           **{kind: head.model for kind, head in tables.HEAD_KINDS.items()}}


def _head_kind(heads: bool | str | None, caller: str) -> str | None:
    """The `heads` argument as a key of _MODELS, or None to detect it."""
    if heads is None or heads in tables.HEAD_KINDS:
        return heads
    if isinstance(heads, bool):
        return "pretraining" if heads else "none"
    raise ValueError(
        f"{caller}: heads={heads!r}; use None (detect), False (BertModel), True (= "
        f"'pretraining') or one of {list(HEADS)}"
    )


def _head_of(name: str, fmt: str) -> str | None:
    for kind, head in tables.HEAD_KINDS.items():
        if (head.hf_names if fmt == "hf" else head.tf_names).fullmatch(name):
            return kind
    return None


def _select_head(given: dict[str, Any], kind: str | None, fmt: str) -> tuple[dict, str]:
    """(given without the names of other heads, the head kind), detecting it when None."""
    found = sorted({_head_of(n, fmt) for n in given} - {None}, key=HEADS.index)
    if kind is None:
        if len(found) > 1:
            raise DataError(
                f"{_FROM[fmt]}: the checkpoint holds the heads of "
                f"{' and '.join(_MODELS[k] for k in found)}; pass heads= one of {found}"
            )
        kind = found[0] if found else "none"
    # Heads other than the one wanted are left behind (all of them when BertModel is wanted).
    kept = {n: v for n, v in given.items() if _head_of(n, fmt) in (None, kind)}
    return kept, kind


def _hf_names(state_dict: Mapping[str, Any], heads: str | None) -> tuple[dict, str, str]:
    """Normalises HF keys: (name -> value without buffers / other heads, head kind, prefix)."""
    given = {}
    for name, value in state_dict.items():
        if _HF_BUFFERS.fullmatch(name):
            continue
        # Old HF files (pytorch-pretrained-bert) named LayerNorm's gain/shift gamma/beta.
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        given[name] = value
    given, heads = _select_head(given, heads, "hf")
    body = [n for n in given if _head_of(n, "hf") is None]
    prefixed = [n for n in body if n.startswith("bert.")]
    if prefixed and len(prefixed) != len(body):
        bare = [n for n in body if not n.startswith("bert.")]
        raise DataError(
            f"params_from_hf: the state dict mixes 'bert.'-prefixed names "
            f"({listing(prefixed, 3)}) with bare ones ({listing(bare, 3)}); pass the state "
            f"dict of one model ({', '.join(_MODELS.values())})"
        )
    # Like HF's loader, accept the encoder's names with or without 'bert.' in either model.
    return given, heads, "bert." if prefixed else ""


def _tf_names(variables: Mapping[str, Any], heads: str | None) -> tuple[dict, str]:
    given = {
        n.removesuffix(":0"): v for n, v in variables.items()
        if not TF_OPTIMIZER_VARIABLES.fullmatch(n.removesuffix(":0"))
    }
    return _select_head(given, heads, "tf")


def _num_labels(given: Mapping[str, Any], heads: str, fmt: str, num_labels: int | None) -> int:
    """The classifier's rows: `num_labels` if given, else read off the checkpoint's tensor."""
    if num_labels is not None:
        if num_labels < 1:
            raise ValueError(f"{_FROM[fmt]}: num_labels must be >= 1, got {num_labels}")
        return num_labels
    if heads == "sequence_classification":
        weight = tables.CLASSIFIER_TABLE[0][0 if fmt == "hf" else 1]
        shape = tuple(getattr(given.get(weight), "shape", ()))
        if len(shape) == 2:
            return shape[0]
    return 2  # unused, or the classifier is missing and the key check reports it


def _load(given: Mapping[str, Any], rows: list[tables.Row], config: BertConfig,
          fmt: str) -> dict[str, np.ndarray]:
    """Flat {our path: array} from `given` (fmt names), with every key and shape checked."""
    caller = _FROM[fmt]
    expected = {row.name(fmt) for row in rows}
    _check_is_bert(given, expected, fmt)
    missing, unexpected = expected - set(given), set(given) - expected
    if missing or unexpected:
        lines = [f"{caller}: the checkpoint does not fit a {config.num_layers}-layer BERT"]
        if missing:
            lines.append(f"  missing keys: {listing(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys: {listing(unexpected)}")
        lines.append("  Build the config from the checkpoint's own with config_from_hf "
                     "(heads=False loads the encoder without the checkpoint's heads).")
        raise DataError("\n".join(lines))

    dtype = jnp.dtype(config.param_dtype)
    flat: dict[str, Any] = {}
    layers: dict[str, list[np.ndarray]] = {}
    for row in rows:
        name = row.name(fmt)
        x = to_numpy(given[name])
        if x.shape != row.shape(fmt):
            fix = ("pass the checkpoint's num_labels (num_labels_from_hf of its config)"
                   if row.ours.startswith("classifier/")
                   else "build the config with config_from_hf")
            raise DataError(
                f"{caller}: {name!r} has shape {x.shape} but the config needs "
                f"{row.shape(fmt)}; {fix}"
            )
        x = row.to_ours(x, fmt).astype(dtype)  # a copy: never aliases the caller's tensors
        if config.scan_layers and row.layer is not None:
            layers.setdefault(row.ours, []).append(x)
        else:
            flat[row.ours] = x
    # Scanned: rows come in layer order, so stacking gives the leading layer axis.
    flat.update({path: np.stack(parts) for path, parts in layers.items()})
    return flat


def params_from_hf(state_dict: Mapping[str, Any], config: BertConfig, *,
                   heads: bool | str | None = None,
                   num_labels: int | None = None) -> dict[str, Any]:
    """Our BERT params pytree from a Hugging Face BERT state dict.

    Args:
      state_dict: name -> numpy array or torch tensor, from BertForPreTraining ('bert.' and
        'cls.' names, with the tied cls.predictions.decoder.* copies),
        BertForQuestionAnswering ('bert.' + 'qa_outputs.'; no pooler),
        BertForSequenceClassification ('bert.' + 'classifier.') or BertModel (bare or
        'bert.'-prefixed names). position_ids / token_type_ids buffers are ignored.
      config: the model to load into (e.g. from `config_from_hf`); its scan_layers picks the
        unscanned (encoder/layer_{i}) or scanned (encoder/layers, leading layer axis) layout.
      heads: which model's params to build: True or 'pretraining' (bert/, predictions/,
        seq_relationship/), 'question_answering' (bert/, qa_outputs/),
        'sequence_classification' (bert/, classifier/), False for BertModel's. The
        checkpoint's other heads are dropped. None picks the head the state dict has (none:
        BertModel). A question-answering checkpoint's missing pooler is filled with zeros.
      num_labels: the classifier's classes (`num_labels_from_hf` of the config.json); None
        reads them off classifier.weight.

    Returns:
      Nested dict of numpy arrays in config.param_dtype, to use as {"params": ...}.

    Raises:
      ValueError: not a BERT checkpoint, missing or unexpected keys, a shape that does not fit
        `config` (or num_labels), a decoder that is not tied to the word embeddings, or
        several heads with heads=None.
    """
    given, heads, prefix = _hf_names(state_dict, _head_kind(heads, "params_from_hf"))
    tied = {copy: given.pop(copy) for copy, _ in _HF_TIED if copy in given}
    if heads == "question_answering" and not any(prefix + n in given for n in _HF_QA_ABSENT):
        d, dtype = config.hidden_size, jnp.dtype(config.param_dtype)
        given[prefix + _HF_QA_ABSENT[0]] = np.zeros((d, d), dtype)
        given[prefix + _HF_QA_ABSENT[1]] = np.zeros((d,), dtype)
    n = _num_labels(given, heads, "hf", num_labels)
    flat = _load(given, tables.rows(config, heads, prefix, n), config, "hf")
    for copy, original in _HF_TIED:
        if copy in tied:
            original = original if original.startswith("cls.") else prefix + original
            x, want = to_numpy(tied[copy]), to_numpy(given[original])
            if x.shape != want.shape or not np.array_equal(x, want):
                raise DataError(
                    f"params_from_hf: {copy!r} differs from {original!r}: the checkpoint has an "
                    "untied MLM decoder, which BERT (decoder tied to the word embeddings) "
                    "cannot represent"
                )
    return traverse_util.unflatten_dict(flat, sep="/")


def params_from_tf_variables(variables: Mapping[str, Any], config: BertConfig, *,
                             heads: bool | str | None = None,
                             num_labels: int | None = None) -> dict[str, Any]:
    """Our BERT params pytree from a google-research/bert TensorFlow checkpoint's variables.

    No TensorFlow here: the caller reads the checkpoint, e.g.
    `{n: tf.train.load_variable(path, n) for n, _ in tf.train.list_variables(path)}`.

    Args:
      variables: TF variable name (bert/encoder/layer_0/attention/self/query/kernel, an
        optional ':0' suffix allowed) -> array. Adam slots (.../adam_m, .../adam_v) and
        global_step are ignored.
      config: the model to load into (e.g. `config_from_hf` of the bert_config.json).
      heads: as params_from_hf, keyed on the TF names: cls/predictions + cls/seq_relationship
        (run_pretraining.py), cls/squad (run_squad.py), the root output_weights / output_bias
        (run_classifier.py).
      num_labels: the classifier's classes; None reads them off output_weights.

    Returns:
      Nested dict of numpy arrays in config.param_dtype.

    Raises:
      ValueError: not a BERT checkpoint, missing or unexpected variables, or a shape that does
        not fit `config`.
    """
    given, heads = _tf_names(variables, _head_kind(heads, "params_from_tf_variables"))
    n = _num_labels(given, heads, "tf", num_labels)
    flat = _load(given, tables.rows(config, heads, "bert.", n), config, "tf")
    return traverse_util.unflatten_dict(flat, sep="/")


def _export(params: Mapping[str, Any], config: BertConfig, heads: bool | str | None, fmt: str,
            hf_prefix: str = "") -> tuple[dict[str, np.ndarray], str]:
    caller = _TO[fmt]
    heads = _head_kind(heads, caller)
    params = nn.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    if heads is None:
        found = [k for k, head in tables.HEAD_KINDS.items()
                 if any(r in params for r in head.roots)]
        if len(found) > 1:
            raise ValueError(
                f"{caller}: the params hold the heads of "
                f"{' and '.join(_MODELS[k] for k in found)}; pass heads= one of {found}"
            )
        # A bert/ subtree without a known head: report BertForPreTraining's missing heads.
        heads = found[0] if found else ("pretraining" if "bert" in params else "none")
    flat = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params, sep="/").items()}
    classifier = flat.get(tables.CLASSIFIER_TABLE[0][2])
    n = classifier.shape[-1] if classifier is not None and classifier.ndim == 2 else 2
    rows = tables.rows(config, heads, hf_prefix if heads == "none" else "bert.", n)
    expected = {row.ours for row in rows}
    missing, unexpected = expected - set(flat), set(flat) - expected
    if missing or unexpected:
        layout = ("scanned (encoder/layers)" if config.scan_layers
                  else "unscanned (encoder/layer_{i})")
        lines = [(
            f"{caller}: the params do not fit the config (a {config.num_layers}-layer "
            f"{_MODELS[heads]}, {layout}; is config.scan_layers right? is heads right?)"
        )]
        if missing:
            lines.append(f"  missing params: {listing(missing)}")
        if unexpected:
            lines.append(f"  unexpected params: {listing(unexpected)}")
        raise ValueError("\n".join(lines))

    out = {}
    for row in rows:
        x = flat[row.ours]
        stacked = config.scan_layers and row.layer is not None
        want = ((config.num_layers,) if stacked else ()) + row.our_shape
        if x.shape != want:
            raise ValueError(
                f"{caller}: param {row.ours!r} has shape {x.shape} but the config needs {want}"
            )
        out[row.name(fmt)] = row.from_ours(x[row.layer] if stacked else x, fmt)
    return out, heads


def params_to_hf(params: Mapping[str, Any], config: BertConfig, *,
                 heads: bool | str | None = None, prefix: str = "") -> dict[str, np.ndarray]:
    """A Hugging Face BERT state dict (numpy, nn.Linear (out, in) layout) from our params.

    Args:
      params: BertModel, BertForPreTraining, BertForQuestionAnswering or
        BertForSequenceClassification params (boxed or not; a {"params": ...} variables dict
        is unwrapped).
      config: their config; scan_layers says which layout they are in.
      heads: as params_from_hf: True / 'pretraining' writes BertForPreTraining's names
        ('bert.' + 'cls.', with the tied cls.predictions.decoder.weight / .bias as copies, as
        HF's own state dict has them); 'question_answering' BertForQuestionAnswering's (no
        pooler, as HF's); 'sequence_classification' BertForSequenceClassification's (num_labels
        from the classifier kernel); False BertModel's. None: the head the params have.
      prefix: without heads, '' (BertModel's own names) or 'bert.' (the names a task model
        gives the encoder).

    Returns:
      HF name -> numpy array in the params' dtype, for `torch.from_numpy` + `load_state_dict`,
      or `safetensors.numpy.save_file` beside a config.json from `config_to_hf`.

    Raises:
      ValueError: missing or unexpected params, or a shape that does not fit `config`.
    """
    if prefix not in ("", "bert."):
        raise ValueError(f"params_to_hf: prefix={prefix!r}; use '' or 'bert.'")
    out, heads = _export(params, config, heads, "hf", prefix)
    if heads == "pretraining":
        for copy, original in _HF_TIED:
            original = original if original.startswith("cls.") else "bert." + original
            out[copy] = out[original].copy()
    if heads == "question_answering":
        for name in _HF_QA_ABSENT:
            del out["bert." + name]
    return out


def params_to_tf_variables(params: Mapping[str, Any], config: BertConfig, *,
                           heads: bool | str | None = None) -> dict[str, np.ndarray]:
    """google-research/bert variable name -> numpy array, from our params (heads as
    params_to_hf; a question-answering model keeps its pooler, as run_squad.py's checkpoints
    do); the inverse of params_from_tf_variables."""
    return _export(params, config, heads, "tf")[0]
