"""Language-model input pipeline: documents -> SentencePiece ids -> packed rows -> grain batches.

Every global batch is the same whatever the process count: the (seeded, per-epoch reshuffled)
order of rows is global, and each process takes its contiguous slice of each global batch.
"""

from collections.abc import Iterator, Sequence

import grain
import ml_collections
import numpy as np

from zoo.data import sources
from zoo.data.packing import pack_lm_rows
from zoo.data.tokenizers import BOS_ID, EOS_ID

Documents = list[list[str]]


def tokenize_documents(tokenizer, documents: Documents) -> list[list[int]]:
    """[bos] + sentence ids ... + [eos] per document."""
    out = []
    for doc in documents:
        ids = [BOS_ID]
        for piece in tokenizer.encode_batch(doc):
            ids.extend(piece)
        ids.append(EOS_ID)
        out.append(ids)
    return out


def packed_rows(tokenizer, documents: Documents, seq_len: int) -> dict[str, np.ndarray]:
    return pack_lm_rows(tokenize_documents(tokenizer, documents), seq_len)


class _Rows(Sequence):
    """Random access to row i of a dict of equally long arrays (a grain data source)."""

    def __init__(self, rows: dict[str, np.ndarray]):
        self._rows = rows
        self._n = len(next(iter(rows.values())))

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        return {k: v[i] for k, v in self._rows.items()}


def _check_batch(batch_size: int, process_count: int, key: str) -> int:
    if batch_size % process_count:
        raise ValueError(
            f"{key}={batch_size} must be divisible by the process count {process_count}"
        )
    return batch_size // process_count


def _local_slice(batch: dict, process_index: int, local: int) -> dict:
    return {k: v[process_index * local : (process_index + 1) * local] for k, v in batch.items()}


def train_iterator(
    rows: dict[str, np.ndarray],
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless, checkpointable (grain get_state/set_state) iterator of process-local batches."""
    local = _check_batch(batch_size, process_count, "config.data.batch_size")
    n = len(_Rows(rows))
    if n < batch_size:
        raise ValueError(
            f"config.data.batch_size={batch_size} exceeds the {n} packed training rows; lower "
            "the batch size or seq_len, or add data"
        )
    dataset = (
        grain.MapDataset.source(_Rows(rows))
        .shuffle(seed=seed)
        .repeat()
        .batch(batch_size, drop_remainder=True)
        .map(lambda b: _local_slice(b, process_index, local))
    )
    # A few batches ahead on 2 threads: batching is GIL-bound numpy work, and grain's default
    # (16 threads, 500 batches ahead) only costs memory and start-up time.
    options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)
    return iter(dataset.to_iter_dataset(options))


def eval_batches(
    rows: dict[str, np.ndarray], batch_size: int, process_index: int = 0, process_count: int = 1
) -> list[dict[str, np.ndarray]]:
    """One ordered pass; the last batch is padded with weight-0 rows so shapes stay fixed."""
    local = _check_batch(batch_size, process_count, "config.data.eval_batch_size")
    n = len(_Rows(rows))
    num = -(-n // batch_size)
    padded = {
        k: np.concatenate([v, np.zeros((num * batch_size - n,) + v.shape[1:], v.dtype)])
        for k, v in rows.items()
    }
    return [
        _local_slice({k: v[i * batch_size : (i + 1) * batch_size] for k, v in padded.items()},
                     process_index, local)
        for i in range(num)
    ]


def unigram_nll_per_token(train_rows: dict, eval_rows: dict, vocab_size: int) -> float:
    """Mean NLL of an add-one unigram model fit on the train targets: the baseline an LM must
    beat to show it learned more than word frequencies."""
    w = train_rows["weights"] > 0
    counts = np.bincount(train_rows["targets"][w], minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    ev = eval_rows["weights"] > 0
    return float(-log_p[eval_rows["targets"][ev]].mean())


def load_splits(cfg: ml_collections.ConfigDict) -> tuple[Documents, Documents]:
    return sources.load_documents(cfg, "train"), sources.load_documents(cfg, "validation")
