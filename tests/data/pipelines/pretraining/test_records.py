"""Prepared format 3: compact fixed-size records that decode to exactly format 2's features,
rows shuffled within each shard, ~5x fewer bytes per example, and a clear error for a directory
of the old format."""

import json
import os

import numpy as np
import pytest

from zoo.data.pipelines import pretraining as pt
from zoo.data.pipelines.pretraining import examples
from zoo.data.pipelines.pretraining import records
from zoo.errors import DataError

SMALL = examples.Settings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2, seed=7)


def _features(corpus, tok, settings, shard=0):
    docs = examples.encode_documents(tok, corpus["validation"])
    return examples.shard_examples(docs, settings, shard, tok, examples.word_start_table(tok))


@pytest.mark.parametrize("dynamic", [False, True])
def test_records_decode_to_the_format_2_features(corpus, tok, dynamic):
    settings = examples.Settings(**{**SMALL.__dict__, "dynamic_masking": dynamic})
    features = _features(corpus, tok, settings)
    encoded = records.encode(features, settings, tok.vocab_size)
    assert encoded.dtype.itemsize == records.record_dtype(settings, tok.vocab_size).itemsize
    decoded = records.decode(encoded)
    assert decoded.keys() == features.keys() == examples.stored_features(settings).keys()
    for k, (dtype, _) in examples.stored_features(settings).items():
        assert decoded[k].dtype == dtype, k
        np.testing.assert_array_equal(decoded[k], features[k])


def test_encode_refuses_what_it_could_not_give_back(corpus, tok):
    features = _features(corpus, tok, SMALL)
    bad = dict(features, token_type_ids=features["token_type_ids"].copy())
    bad["token_type_ids"][0, 1] = 1  # a 1 inside segment A: not [CLS] A [SEP] B [SEP]
    with pytest.raises(ValueError, match="token_type_ids"):
        records.encode(bad, SMALL, tok.vocab_size)
    with pytest.raises(ValueError, match="vocabulary of 100"):
        records.encode(features, SMALL, 100)


def _bytes(seq_len, predictions):
    # Phase-1 / phase-2 preparation: static masks, 5 passes, the BERT vocabulary.
    settings = examples.Settings(max_seq_length=seq_len, max_predictions_per_seq=predictions,
                                 dupe_factor=5)
    return records.format2_bytes(settings), records.record_dtype(settings, 30522).itemsize


def test_bytes_per_example_are_at_least_3x_fewer():
    # Phase 1: 1,780 -> 320 bytes (5.6x); phase 2: 7,108 -> 1,350 bytes (5.3x).
    assert _bytes(128, 20) == (1780, 320)
    assert _bytes(512, 80) == (7108, 1350)
    for before, after in (_bytes(128, 20), _bytes(512, 80)):
        assert before >= 3 * after
    assert records.smallest_uint(255) == np.uint8 and records.smallest_uint(256) == np.uint16


def test_a_shards_rows_are_shuffled_by_seed_and_shard(corpus, tok):
    a, again = _features(corpus, tok, SMALL), _features(corpus, tok, SMALL)
    np.testing.assert_array_equal(a["input_ids"], again["input_ids"])  # deterministic
    other_shard = _features(corpus, tok, SMALL, shard=1)
    assert not np.array_equal(a["input_ids"], other_shard["input_ids"])
    # Unshuffled, pass 0's rows come first and neighbours share a document (B continues A's
    # text half the time); shuffled, neighbours are from anywhere: the two passes interleave.
    labels = a["next_sentence_labels"]
    n = len(labels)
    keys = [r.tobytes() for r in a["input_ids"]]
    one_pass = examples.Settings(**{**SMALL.__dict__, "dupe_factor": 1})
    pass0 = {r.tobytes() for r in _features(corpus, tok, one_pass)["input_ids"]}
    first_half = np.mean([k in pass0 for k in keys[:n // 2]])
    assert 0.3 < first_half < 0.7  # pass 0 would fill the first half exactly


def test_an_old_format_directory_asks_to_prepare_again(corpus, tok, tmp_path):
    source = pt.prepare(corpus["validation"], tok, str(tmp_path), "v",
                        examples.Settings(**{**SMALL.__dict__, "dupe_factor": 1}))
    manifest = os.path.join(source.path, "manifest.json")
    old = json.load(open(manifest))
    old["format"] = 2
    json.dump(old, open(manifest, "w"))
    with pytest.raises(DataError, match=r"format 2.*reads format 3.*prepare it again"):
        pt.PretrainingSource(source.path)
