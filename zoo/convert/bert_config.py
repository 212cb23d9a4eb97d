"""Hugging Face / google-research/bert configs <-> zoo's BertConfig: which HF options our BERT
implements (anything else would change the function, so it is refused), which fields a caller
may still choose, and the HF config dict a saved model carries. The parameters' half is
zoo.convert.bert, which re-exports these functions.
"""

from collections.abc import Mapping
from typing import Any

from zoo.errors import DataError
from zoo.models.bert import BertConfig
from zoo.models.runtime_fields import RUN_CHOICES

# HF BERT options and the values our BERT implements; anything else changes the function.
_FIXED_OPTIONS = (
    ("hidden_act", ("gelu",), "BERT uses the exact (erf) GELU; HF's 'gelu' is that one"),
    ("position_embedding_type", ("absolute",), "BERT uses learned absolute positions"),
    ("is_decoder", (False,), "BERT is a bidirectional encoder"),
    ("add_cross_attention", (False,), "BERT is a bidirectional encoder"),
    ("tie_word_embeddings", (True,), "the MLM decoder is tied to the word embeddings"),
)
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size")


def config_from_hf(hf_config: Mapping[str, Any] | Any, **overrides: Any) -> BertConfig:
    """The BertConfig of a Hugging Face BERT config or a google-research `bert_config.json`.

    Args:
      hf_config: the config as a dict (or a `transformers.BertConfig`). google-research's
        bert_config.json has no model_type and is read the same way.
      **overrides: the run's choices, which no checkpoint makes
        (zoo.models.runtime_fields.RUN_CHOICES: the dropout rates, the attention kernel, the
        layer scan, remat, the dtypes); every other field comes from the checkpoint.

    Raises:
      ValueError: not a BERT config, or one using an option our BERT does not implement.
    """
    hf = dict(hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config)
    model_type = hf.get("model_type", "bert")
    if model_type != "bert":
        raise DataError(f"config_from_hf: model_type={model_type!r}, not a BERT config")
    missing = [k for k in _REQUIRED if k not in hf]
    if missing:
        raise DataError(f"config_from_hf: the BERT config lacks {missing}")
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
    d, heads = hf["hidden_size"], hf["num_attention_heads"]
    if d % heads:
        raise DataError(
            f"config_from_hf: hidden_size={d} is not divisible by num_attention_heads={heads}"
        )
    kw = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=d,
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
        layer_norm_epsilon=hf.get("layer_norm_eps", 1e-12),
        initializer_range=hf.get("initializer_range", 0.02),
    )
    kw.update(overrides)
    return BertConfig(**kw)


def num_labels_from_hf(hf_config: Mapping[str, Any] | Any) -> int:
    """The classes of a BertForSequenceClassification config: len(id2label), else num_labels,
    else HF's default of 2."""
    hf = dict(hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config)
    if hf.get("id2label"):
        return len(hf["id2label"])
    return int(hf.get("num_labels", 2))


def config_to_hf(config: BertConfig, *, num_labels: int | None = None,
                 **extra: Any) -> dict[str, Any]:
    """The Hugging Face BERT config dict (for `transformers.BertConfig(**d)`) of `config`.

    Its fields are a superset of google-research's bert_config.json.

    Args:
      config: our model config.
      num_labels: for BertForSequenceClassification: writes id2label / label2id with HF's
        default names LABEL_0 .. (pass id2label= in `extra` for real names).
      **extra: more HF fields, e.g. pad_token_id from the tokenizer (HF's default is 0), or
        architectures=["BertForQuestionAnswering"].
    """
    hf = dict(
        model_type="bert",
        architectures=["BertForPreTraining"],
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        hidden_act="gelu",
        hidden_dropout_prob=config.dropout_rate,
        attention_probs_dropout_prob=config.attention_dropout_rate,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.layer_norm_epsilon,
        initializer_range=config.initializer_range,
        position_embedding_type="absolute",
        is_decoder=False,
        add_cross_attention=False,
        tie_word_embeddings=True,
        dtype=config.param_dtype,
    )
    if num_labels is not None:
        if num_labels < 1:
            raise ValueError(f"config_to_hf: num_labels must be >= 1, got {num_labels}")
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
    hf.update(extra)
    return hf
