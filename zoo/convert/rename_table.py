"""One row of a rename table between a reference checkpoint and zoo params: the row type every
converter instantiates its tables into (zoo.convert.gpt2, zoo.convert.bert_tables).

A row names one reference tensor (its Hugging Face name and, for BERT, its google-research/bert
TensorFlow name) and the zoo param(s) it becomes, with both shapes and how the two are laid out
(see zoo.convert.bert_tables for the three layouts).
"""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Row:
    """One tensor: its name in each layout, both shapes, and how to convert it."""

    hf: str
    hf_shape: tuple[int, ...]
    # A fused reference tensor (GPT-2's c_attn: q, k and v side by side) becomes several of our
    # params, so GPT-2's rows name a tuple; BERT's name one path.
    ours: str | tuple[str, ...]
    our_shape: tuple[int, ...]
    layer: int | None  # which layer a per-layer row belongs to (its slice when scanned)
    tf: str = ""  # the google-research/bert TensorFlow name ('' where there is none)
    layout: str = "same"  # 'same', 'linear' or 'output_weights' (zoo.convert.bert_tables)

    def name(self, fmt: str) -> str:
        return self.hf if fmt == "hf" else self.tf

    def _transposed(self, fmt: str) -> bool:
        """Whether the `fmt` tensor is (out, in) against our (in, out)."""
        if fmt == "hf":
            return self.layout != "same"
        return self.layout == "output_weights"

    def shape(self, fmt: str) -> tuple[int, ...]:
        if fmt == "tf" and self.layout == "linear":
            return self.hf_shape[::-1]
        return self.hf_shape

    def to_ours(self, x: np.ndarray, fmt: str) -> np.ndarray:
        return (x.T if self._transposed(fmt) else x).reshape(self.our_shape)

    def from_ours(self, x: np.ndarray, fmt: str) -> np.ndarray:
        shape = self.shape(fmt)
        if self._transposed(fmt):
            return np.ascontiguousarray(x.reshape(shape[::-1]).T)
        return x.reshape(shape).copy()
