"""BERT pretraining data on disk: the prepared cache (keyed, reused, checked)."""

import collections
import os

import numpy as np
import pytest

from zoo.data.pipelines import pretraining as pt
from zoo.data.pipelines.pretraining import examples
from zoo.data.tokenizers import base as tokenizers

L = 64


def _is_special(tok, ids):
    return np.isin(ids, list(tok.special_ids))


SMALL = examples.Settings(max_seq_length=L, max_predictions_per_seq=10, dupe_factor=1, seed=7)


def _arrays(source):
    return {k: np.stack([source[i][k] for i in range(len(source))]) for k in source[0]}


def test_cache_is_reused_keyed_and_checked(corpus, tok, tmp_path, monkeypatch):
    docs = corpus["validation"]
    made = []
    real = pt._make_shard
    monkeypatch.setattr(pt, "_make_shard", lambda task: made.append(task[0]) or real(task))

    first = pt.prepare(docs, tok, str(tmp_path), "validation", SMALL, num_shards=3)
    manifest = os.path.join(first.path, "manifest.json")
    mtime = os.stat(manifest).st_mtime_ns
    again = pt.prepare(docs, tok, str(tmp_path), "validation", SMALL, num_shards=3)
    assert made == [0, 1, 2] and again.path == first.path
    assert os.stat(manifest).st_mtime_ns == mtime
    a, b = _arrays(first), _arrays(again)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert first.manifest["num_examples"] == len(first) == sum(first.manifest["shard_rows"])

    # Static rows are masked with BERT's count: put the labels back, recount maskable tokens.
    w = a["masked_lm_weights"] > 0
    rows = np.arange(len(first))[:, None].repeat(10, 1)
    original = a["input_ids"].copy()
    original[rows[w], a["masked_lm_positions"][w]] = a["masked_lm_ids"][w]
    n = (~_is_special(tok, original)).sum(1)
    np.testing.assert_array_equal(w.sum(1), np.minimum(10, np.maximum(1, np.round(0.15 * n))))

    other = pt.prepare(docs, tok, str(tmp_path), "validation",
                       examples.Settings(**{**SMALL.__dict__, "masked_lm_prob": 0.2}), num_shards=3)
    tok2 = tokenizers.train_sentencepiece([s for d in corpus["train"] for s in d], 200)
    other_tok = pt.prepare(docs, tok2, str(tmp_path), "validation", SMALL, num_shards=3)
    edited = [list(d) for d in docs]
    edited[5][0] += " Really."
    other_text = pt.prepare(edited, tok, str(tmp_path), "validation", SMALL, num_shards=3)
    assert len({first.path, other.path, other_tok.path, other_text.path}) == 4
    assert len(made) == 12
    leftovers = [f for _, _, files in os.walk(tmp_path) for f in files if ".tmp" in f]
    assert not leftovers  # every temporary name renamed or removed

    shard = os.path.join(first.path, "examples-00002.npy")
    np.save(shard, np.load(shard)[:-1])  # a shard that lost a row
    with pytest.raises(ValueError, match=f"{first.path}.*examples-00002.*delete"):
        pt.prepare(docs, tok, str(tmp_path), "validation", SMALL, num_shards=3)
    os.remove(os.path.join(first.path, "examples-00001.npy"))
    with pytest.raises(ValueError, match=f"{first.path}.*examples-00001.npy.*delete"):
        pt.prepare(docs, tok, str(tmp_path), "validation", SMALL, num_shards=3)


def test_tokenizer_without_encode_batch_gives_the_same_examples(corpus, tok, tmp_path):
    class EncodeOnly:  # the interface minus the optional encode_batch
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            if name == "encode_batch":
                raise AttributeError(name)
            return getattr(self._inner, name)

    docs = corpus["validation"]
    a = pt.prepare(docs, tok, str(tmp_path), "v", SMALL)
    b = pt.prepare(docs, EncodeOnly(tok), str(tmp_path), "v", SMALL)
    assert a.path != b.path  # another tokenizer class: its own cache
    for k, v in _arrays(a).items():
        np.testing.assert_array_equal(_arrays(b)[k], v)


def test_dupe_factor_adds_passes_with_new_pairs_and_masks(corpus, tok, tmp_path):
    docs = corpus["validation"]
    one = _arrays(pt.prepare(docs, tok, str(tmp_path), "v", SMALL))
    two = _arrays(pt.prepare(docs, tok, str(tmp_path), "v",
                             examples.Settings(**{**SMALL.__dict__, "dupe_factor": 2})))
    n = len(one["input_ids"])

    def rows(arrays):  # each row's features as one key (a shard's rows are shuffled)
        return collections.Counter(b"".join(arrays[k][i].tobytes() for k in sorted(arrays))
                                   for i in range(len(arrays["input_ids"])))

    # Pass 0 draws from the same rng either way: every row of `one` is in `two`; pass 1 is new
    # data of about the same size, its pairs and masks nearly all new.
    first, both = rows(one), rows(two)
    assert not first - both
    assert 0.8 * n < (both - first).total() < 1.2 * n
    assert len(both) > 1.8 * n
