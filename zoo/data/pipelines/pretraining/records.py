"""The on-disk record of one BERT pretraining example (prepared format 3): a numpy structured
dtype of fixed size, so a shard is one `.npy` file whose consecutive rows are one contiguous
byte range (what the bucket reader fetches with a single ranged GET).

Only what cannot be derived is stored, each in the smallest unsigned type that holds it:
  input_ids        [L]  token ids: uint8 / uint16 / uint32 by the vocabulary size
  a_length              len([CLS] A [SEP]) = where token_type_ids turn 1: uint8 for L <= 255
  length                len([CLS] A [SEP] B [SEP]) = the attention_mask's ones
  next_sentence_label   0 IsNext, 1 NotNext: uint8
  masked_lm_positions [P] (static masks only) in the length type
  masked_lm_ids    [P]  (static masks only) in the token type
  num_predictions       (static masks only) masked_lm_weights' ones (a prefix: mask_batch sorts
                        the real targets first): uint8 for P <= 255

`decode` gives back exactly the int32 / float32 feature dict of format 2
(zoo.data.pipelines.pretraining.examples.PAIR_FEATURES / MLM_FEATURES), so nothing downstream
changes; `encode` refuses features it could not give back (a layout this file does not know).
"""

from __future__ import annotations

import numpy as np

from zoo.data.pipelines.pretraining.examples import MLM_FEATURES, PAIR_FEATURES, Settings


def smallest_uint(largest: int) -> np.dtype:
    """The narrowest unsigned dtype holding 0..largest."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if largest <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def record_dtype(settings: Settings, vocab_size: int) -> np.dtype:
    """The packed (unaligned) record of one example under `settings` and a vocabulary."""
    token = smallest_uint(vocab_size - 1)
    length = smallest_uint(settings.max_seq_length)  # positions < L <= the length type
    fields = [
        ("input_ids", token, (settings.max_seq_length,)),
        ("a_length", length),
        ("length", length),
        ("next_sentence_label", np.uint8),
    ]
    if not settings.dynamic_masking:
        fields += [
            ("masked_lm_positions", length, (settings.max_predictions_per_seq,)),
            ("masked_lm_ids", token, (settings.max_predictions_per_seq,)),
            ("num_predictions", smallest_uint(settings.max_predictions_per_seq)),
        ]
    return np.dtype(fields)


def encode(features: dict[str, np.ndarray], settings: Settings, vocab_size: int,
           verify: bool = True) -> np.ndarray:
    """Structured records [N] of format-2 feature arrays (shard_examples' output).

    `verify` decodes the records and compares them with the features. Preparation skips it for
    shard_examples' own output, whose layout is the record's by construction (and tested so):
    it costs a sixth of making a shard.

    Raises:
      ValueError: the features hold what the record cannot give back (ids outside the
        vocabulary, token types or attention not of the [CLS] A [SEP] B [SEP] layout, masked
        weights that are not a prefix of ones).
    """
    n = len(features["input_ids"])
    records = np.zeros(n, record_dtype(settings, vocab_size))
    ids = features["input_ids"]
    if n and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids outside the vocabulary of {vocab_size}")
    records["input_ids"] = ids
    records["length"] = features["attention_mask"].sum(axis=1)
    # token_type_ids are 0 over [CLS] A [SEP] and 1 over B [SEP]: A ends where the 1s start.
    records["a_length"] = records["length"] - features["token_type_ids"].sum(axis=1)
    records["next_sentence_label"] = features["next_sentence_labels"]
    if not settings.dynamic_masking:
        records["masked_lm_positions"] = features["masked_lm_positions"]
        records["masked_lm_ids"] = features["masked_lm_ids"]
        records["num_predictions"] = features["masked_lm_weights"].sum(axis=1)
    if not verify:
        return records
    back = decode(records)
    for k, v in features.items():
        if not np.array_equal(back[k], v):
            raise ValueError(f"feature {k} does not fit the format-3 record (see "
                             "zoo.data.pipelines.pretraining.records)")
    return records


def decode(records: np.ndarray) -> dict[str, np.ndarray]:
    """The int32 / float32 features [N, ...] of records [N] (format 2's arrays exactly)."""
    n, seq_len = records["input_ids"].shape
    at = np.arange(seq_len)
    length = records["length"].astype(np.int32)[:, None]
    a_length = records["a_length"].astype(np.int32)[:, None]
    out = {
        "input_ids": records["input_ids"].astype(np.int32),
        "token_type_ids": ((at >= a_length) & (at < length)).astype(np.int32),
        "attention_mask": (at < length).astype(np.int32),
        "next_sentence_labels": records["next_sentence_label"].astype(np.int32),
    }
    if "num_predictions" in records.dtype.names:
        p = records["masked_lm_positions"].shape[1]
        out["masked_lm_positions"] = records["masked_lm_positions"].astype(np.int32)
        out["masked_lm_ids"] = records["masked_lm_ids"].astype(np.int32)
        out["masked_lm_weights"] = (np.arange(p) < records["num_predictions"][:, None]).astype(
            np.float32)
    return out


def format2_bytes(settings: Settings) -> int:
    """Bytes per example of format 2 (one int32 / float32 .npy file per feature)."""
    dims = {"L": settings.max_seq_length, "P": settings.max_predictions_per_seq, "": 1}
    features = {**PAIR_FEATURES, **({} if settings.dynamic_masking else MLM_FEATURES)}
    return sum(np.dtype(dtype).itemsize * dims[d] for dtype, d in features.values())
