"""The rename table between Hugging Face, google-research/bert and zoo BERT parameters
(zoo.convert.bert reads and writes checkpoints through it).

Each row names a tensor in Hugging Face (BertModel, BertForPreTraining, BertForQuestionAnswering,
BertForSequenceClassification state dicts), in the google-research/bert TensorFlow checkpoint
(run_pretraining.py, run_squad.py, run_classifier.py) and in our params, with its HF shape, our
shape and how the two are laid out:

* 'same': identical up to a C-order reshape (embeddings, LayerNorms, biases; a q/k/v bias of
  D = H*K values becomes our (H, K), column h*K + k belonging to head h as in HF's head split).
* 'linear': an nn.Linear. HF stores (out, in), TF's `kernel` and ours (in, out) (ours with the
  in/out axes further split into heads: q/k/v (D, H, K), the attention output (H, K, D)).
* 'output_weights': the NSP, SQuAD and classifier layers, which google-research/bert stores
  as `output_weights` (out, H), the (out, in) orientation of HF, transposed against our
  (H, out) kernel.

`rows(config, heads, ...)` instantiates the tables for one config: concrete names, paths and
shapes, one `Row` per tensor.
"""

import dataclasses
import re

# Row, the row type every converter shares, lives in zoo.convert.rename_table; zoo.convert.bert
# still names it tables.Row.
from zoo.convert.rename_table import Row
from zoo.models.bert import BertConfig

# Shapes are symbols resolved from the config (`_dims`): V vocab, P positions, S segment types,
# D hidden width, H heads, K head width (D // H), F intermediate width, 2 the NSP classes.
# Rows: (HF name, TF name, our path, HF shape, our shape, layout).
# BertModel tensors: HF names bare or under 'bert.', TF under 'bert/', ours under bert/ in
# BertForPreTraining's params (at the root in BertModel's).
MODEL_TABLE = (
    ("embeddings.word_embeddings.weight", "embeddings/word_embeddings",
     "embeddings/word_embeddings/embedding", "V D", "V D", "same"),
    ("embeddings.position_embeddings.weight", "embeddings/position_embeddings",
     "embeddings/position_embeddings/embedding", "P D", "P D", "same"),
    ("embeddings.token_type_embeddings.weight", "embeddings/token_type_embeddings",
     "embeddings/token_type_embeddings/embedding", "S D", "S D", "same"),
    ("embeddings.LayerNorm.weight", "embeddings/LayerNorm/gamma", "embeddings/norm/scale",
     "D", "D", "same"),
    ("embeddings.LayerNorm.bias", "embeddings/LayerNorm/beta", "embeddings/norm/bias",
     "D", "D", "same"),
    ("pooler.dense.weight", "pooler/dense/kernel", "pooler/dense/kernel", "D D", "D D", "linear"),
    ("pooler.dense.bias", "pooler/dense/bias", "pooler/dense/bias", "D", "D", "same"),
)
# Per layer: HF under encoder.layer.{i}., TF under encoder/layer_{i}/, ours under
# encoder/layer_{i}/ (encoder/layers/ when scanned).
LAYER_TABLE = tuple(
    (f"attention.self.{p}.weight", f"attention/self/{p}/kernel", f"self_attention/{p}/kernel",
     "D D", "D H K", "linear")
    for p in ("query", "key", "value")
) + tuple(
    (f"attention.self.{p}.bias", f"attention/self/{p}/bias", f"self_attention/{p}/bias",
     "D", "H K", "same")
    for p in ("query", "key", "value")
) + (
    ("attention.output.dense.weight", "attention/output/dense/kernel", "self_attention/out/kernel",
     "D D", "H K D", "linear"),
    ("attention.output.dense.bias", "attention/output/dense/bias", "self_attention/out/bias",
     "D", "D", "same"),
    ("attention.output.LayerNorm.weight", "attention/output/LayerNorm/gamma",
     "self_attention_norm/scale", "D", "D", "same"),
    ("attention.output.LayerNorm.bias", "attention/output/LayerNorm/beta",
     "self_attention_norm/bias", "D", "D", "same"),
    ("intermediate.dense.weight", "intermediate/dense/kernel", "mlp/wi/kernel",
     "F D", "D F", "linear"),
    ("intermediate.dense.bias", "intermediate/dense/bias", "mlp/wi/bias", "F", "F", "same"),
    ("output.dense.weight", "output/dense/kernel", "mlp/wo/kernel", "D F", "F D", "linear"),
    ("output.dense.bias", "output/dense/bias", "mlp/wo/bias", "D", "D", "same"),
    ("output.LayerNorm.weight", "output/LayerNorm/gamma", "mlp_norm/scale", "D", "D", "same"),
    ("output.LayerNorm.bias", "output/LayerNorm/beta", "mlp_norm/bias", "D", "D", "same"),
)
# Pretraining heads: HF under cls., TF under cls/, ours at BertForPreTraining's root.
PRETRAINING_TABLE = (
    ("cls.predictions.transform.dense.weight", "cls/predictions/transform/dense/kernel",
     "predictions/transform/kernel", "D D", "D D", "linear"),
    ("cls.predictions.transform.dense.bias", "cls/predictions/transform/dense/bias",
     "predictions/transform/bias", "D", "D", "same"),
    ("cls.predictions.transform.LayerNorm.weight", "cls/predictions/transform/LayerNorm/gamma",
     "predictions/transform_norm/scale", "D", "D", "same"),
    ("cls.predictions.transform.LayerNorm.bias", "cls/predictions/transform/LayerNorm/beta",
     "predictions/transform_norm/bias", "D", "D", "same"),
    ("cls.predictions.bias", "cls/predictions/output_bias", "predictions/output_bias",
     "V", "V", "same"),
    ("cls.seq_relationship.weight", "cls/seq_relationship/output_weights",
     "seq_relationship/kernel", "2 D", "D 2", "output_weights"),
    ("cls.seq_relationship.bias", "cls/seq_relationship/output_bias", "seq_relationship/bias",
     "2", "2", "same"),
)
# The SQuAD span head: HF's BertForQuestionAnswering, TF's run_squad.py.
QA_TABLE = (
    ("qa_outputs.weight", "cls/squad/output_weights", "qa_outputs/kernel", "2 D", "D 2",
     "output_weights"),
    ("qa_outputs.bias", "cls/squad/output_bias", "qa_outputs/bias", "2", "2", "same"),
)
# The sentence classifier: HF's BertForSequenceClassification, TF's run_classifier.py. N is
# num_labels.
CLASSIFIER_TABLE = (
    ("classifier.weight", "output_weights", "classifier/kernel", "N D", "D N", "output_weights"),
    ("classifier.bias", "output_bias", "classifier/bias", "N", "N", "same"),
)


@dataclasses.dataclass(frozen=True)
class Head:
    """A task head's rows and how to recognise its tensors by name."""

    table: tuple
    hf_names: re.Pattern  # which HF / TF names belong to this head
    tf_names: re.Pattern
    roots: tuple[str, ...]  # its subtrees at the root of our params
    model: str  # the model class (ours and HF's) that has it


HEAD_KINDS = {
    "pretraining": Head(PRETRAINING_TABLE, re.compile(r"cls\..*"),
                        re.compile(r"cls/(predictions|seq_relationship)/.*"),
                        ("predictions", "seq_relationship"), "BertForPreTraining"),
    "question_answering": Head(QA_TABLE, re.compile(r"qa_outputs\..*"),
                               re.compile(r"cls/squad/.*"), ("qa_outputs",),
                               "BertForQuestionAnswering"),
    "sequence_classification": Head(CLASSIFIER_TABLE, re.compile(r"classifier\..*"),
                                    re.compile(r"output_(weights|bias)"), ("classifier",),
                                    "BertForSequenceClassification"),
}
HEADS = tuple(HEAD_KINDS)  # the head kinds, in detection order



def _dims(config: BertConfig, num_labels: int) -> dict[str, int]:
    d = config.hidden_size
    return dict(
        V=config.vocab_size, P=config.max_position_embeddings, S=config.type_vocab_size, D=d,
        H=config.num_heads, K=d // config.num_heads, F=config.intermediate_size, N=num_labels,
        **{"2": 2},
    )


def rows(config: BertConfig, heads: str, hf_prefix: str, num_labels: int = 2) -> list[Row]:
    """The tables instantiated for `config`: concrete names, paths and shapes.

    heads is a key of HEAD_KINDS or 'none' (BertModel); hf_prefix is '' or 'bert.' for the
    BertModel tensors' HF names; num_labels sizes the classifier rows.
    """
    dims = _dims(config, num_labels)

    def shape(spec):
        return tuple(dims[s] for s in spec.split())

    ours_prefix = "" if heads == "none" else "bert/"
    rows = [
        Row(hf_prefix + hf, shape(hs), ours_prefix + ours, shape(os_), None,
            tf="bert/" + tf, layout=layout)
        for hf, tf, ours, hs, os_, layout in MODEL_TABLE
    ]
    for i in range(config.num_layers):
        layer = "layers" if config.scan_layers else f"layer_{i}"
        ours_layer = f"{ours_prefix}encoder/{layer}"
        rows += [
            Row(f"{hf_prefix}encoder.layer.{i}.{hf}", shape(hs), f"{ours_layer}/{ours}",
                shape(os_), i, tf=f"bert/encoder/layer_{i}/{tf}", layout=layout)
            for hf, tf, ours, hs, os_, layout in LAYER_TABLE
        ]
    if heads != "none":
        rows += [
            Row(hf, shape(hs), ours, shape(os_), None, tf=tf, layout=layout)
            for hf, tf, ours, hs, os_, layout in HEAD_KINDS[heads].table
        ]
    return rows
