"""Packing variable-length token sequences into fixed-length language-model rows.

Documents are concatenated into one stream and cut into windows of `seq_len + 1` tokens with
stride `seq_len`, so every token after the first is a target exactly once and no row is padding
except the tail. Each document keeps its own segment id, and each row carries positions that
restart at every document start (and at the row start for a document cut by the window), so the
model's segment mask stops attention from crossing documents.
"""

from collections.abc import Sequence

import numpy as np

from zoo.errors import ConfigError, DataError


def pack_lm_rows(sequences: Sequence[Sequence[int]], seq_len: int) -> dict[str, np.ndarray]:
    """Packs token sequences into LM rows.

    Args:
      sequences: token-id lists, one per document (already carrying bos/eos if wanted).
      seq_len: model input length T.

    Returns:
      dict of int32 arrays, each [num_rows, T]: `inputs`, `targets` (the next token),
      `segment_ids` (>= 1 for tokens, 0 for padding), `positions` (restart per document and
      row), and float32 `weights` (1 where the target continues the same document).
    """
    if seq_len < 1:
        raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    if lengths.sum() < 2:
        raise DataError(
            "pack_lm_rows: the corpus has fewer than 2 tokens in total; nothing to train on "
            "(check that the data source is not empty)"
        )
    stream = np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences if len(s)])
    segments = np.repeat(np.arange(1, len(lengths) + 1, dtype=np.int32), lengths)
    offsets = np.arange(len(stream)) - np.repeat(np.cumsum(lengths) - lengths, lengths)

    num_rows = int(np.ceil((len(stream) - 1) / seq_len))
    total = num_rows * seq_len + 1
    pad = total - len(stream)
    stream = np.pad(stream, (0, pad))
    segments = np.pad(segments, (0, pad))
    offsets = np.pad(offsets, (0, pad))

    # (rows, T + 1) windows with stride T: row r covers stream[r*T : r*T + T + 1].
    index = np.arange(num_rows)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    tokens, segs, offs = stream[index], segments[index], offsets[index]

    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    in_segs = segs[:, :-1]
    weights = ((in_segs == segs[:, 1:]) & (in_segs != 0)).astype(np.float32)
    # A document cut by the window start continues from offset k; restart it at 0 in this row
    # so positions stay below the model's max length.
    first_seg = in_segs[:, :1]
    positions = np.where(in_segs == first_seg, offs[:, :-1] - offs[:, :1], offs[:, :-1])
    positions = np.where(in_segs == 0, 0, positions)
    return {
        "inputs": inputs.astype(np.int32),
        "targets": targets.astype(np.int32),
        "segment_ids": in_segs.astype(np.int32),
        "positions": positions.astype(np.int32),
        "weights": weights,
    }
