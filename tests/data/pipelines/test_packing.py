import numpy as np
import pytest

from zoo.data.pipelines.packing import pack_lm_rows


def test_every_target_is_the_next_token_of_its_own_document():
    docs = [[2, 5, 6, 7, 3], [2, 8, 3], [2, 9, 10, 11, 12, 13, 3]]
    rows = pack_lm_rows(docs, seq_len=4)
    stream_pairs = {(d, i) for d, doc in enumerate(docs) for i in range(len(doc) - 1)}
    seen = []
    # Rebuild (document, offset) for each weighted target from the row's segment and position.
    for r in range(rows["inputs"].shape[0]):
        for t in range(4):
            if rows["weights"][r, t]:
                seg = rows["segment_ids"][r, t] - 1
                assert rows["targets"][r, t] != 0
                seen.append((seg, rows["inputs"][r, t], rows["targets"][r, t]))
    # Each within-document bigram appears exactly once as (input, target).
    expected = [(d, doc[i], doc[i + 1]) for d, doc in enumerate(docs) for i in range(len(doc) - 1)]
    assert sorted(seen) == sorted(expected)
    assert len(seen) == len(stream_pairs)


def test_positions_restart_per_document_and_stay_below_seq_len():
    docs = [list(range(2, 30)), [2, 5, 3]]
    rows = pack_lm_rows(docs, seq_len=8)
    assert rows["positions"].max() < 8
    for r in range(rows["inputs"].shape[0]):
        seg, pos = rows["segment_ids"][r], rows["positions"][r]
        for t in range(1, 8):
            if seg[t] != 0 and seg[t] == seg[t - 1]:
                assert pos[t] == pos[t - 1] + 1
            elif seg[t] != 0:
                assert pos[t] == 0


def test_padding_has_zero_weight_and_segment():
    rows = pack_lm_rows([[2, 4, 3]], seq_len=8)
    assert rows["inputs"].shape == (1, 8)
    np.testing.assert_array_equal(rows["weights"][0], [1, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(rows["segment_ids"][0, 3:], 0)


def test_empty_corpus_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than 2 tokens"):
        pack_lm_rows([[], [7]], seq_len=4)
