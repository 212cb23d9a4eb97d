"""What a Hugging Face directory holds, as zoo reads (zoo.convert.hf) and writes
(zoo.convert.hf_save) it: the architectures zoo supports, the files' names, and the tied copies HF
leaves out of saved weights. zoo.convert.hf re-exports the public names here.
"""

from collections.abc import Mapping
from typing import Any

# Architecture -> (model_type, head): the BERT head kind of zoo.convert.bert ('none' for the
# encoder alone), or for GPT-2 whether the names carry GPT2LMHeadModel's 'transformer.' prefix.
SUPPORTED_ARCHITECTURES: dict[str, tuple[str, Any]] = {
    "BertModel": ("bert", "none"),
    "BertForPreTraining": ("bert", "pretraining"),
    "BertForQuestionAnswering": ("bert", "question_answering"),
    "BertForSequenceClassification": ("bert", "sequence_classification"),
    "GPT2LMHeadModel": ("gpt2", True),
    "GPT2Model": ("gpt2", False),
}
BERT_ARCHITECTURE = {head: arch for arch, (family, head) in SUPPORTED_ARCHITECTURES.items()
                     if family == "bert"}

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
TORCH_FILE = "pytorch_model.bin"
# In HF's order of preference: safetensors first, sharded after single files.
WEIGHTS_FILES = (SAFETENSORS_FILE, SAFETENSORS_FILE + ".index.json", TORCH_FILE,
                 TORCH_FILE + ".index.json")
TF_FILES = ("tf_model.h5", "flax_model.msgpack")  # Keras / Flax weights: not read
GOOGLE_CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_FILE = "tokenizer.json"
# The tied copies HF itself leaves out of saved files (re-tied on load).
TIED_COPIES = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
               "lm_head.weight")


def bert_head_of(params: Mapping[str, Any]) -> str:
    """The BERT head kind (zoo.convert.bert's) whose parameters `params` hold ('none': the
    encoder alone)."""
    for head, root in (("pretraining", "predictions"), ("question_answering", "qa_outputs"),
                       ("sequence_classification", "classifier")):
        if root in params:
            return head
    return "none"
