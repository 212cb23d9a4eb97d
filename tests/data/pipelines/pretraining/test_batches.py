"""Batches of prepared BERT pretraining examples: dynamic masks, restore, process slices, eval."""

import grain
import numpy as np
import pytest

from zoo.data.pipelines import masking
from zoo.data.pipelines import pretraining as pt
from zoo.data.pipelines.pretraining import batches as pb
from zoo.data.pipelines.pretraining import examples

SMALL = examples.Settings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1, seed=7)


@pytest.fixture(scope="module")
def dynamic_source(corpus, tok, tmp_path_factory):
    settings = examples.Settings(**{**SMALL.__dict__, "dynamic_masking": True})
    source = pt.prepare(corpus["validation"], tok, str(tmp_path_factory.mktemp("dyn")),
                        "validation", settings, num_shards=2)
    assert "masked_lm_ids" not in source[0]  # stored unmasked
    return source


@pytest.fixture(scope="module")
def static_source(corpus, tok, tmp_path_factory):
    return pt.prepare(corpus["validation"], tok, str(tmp_path_factory.mktemp("static")),
                      "validation", SMALL, num_shards=2)


def _unmasked(batch, r):
    ids = batch["input_ids"][r].copy()
    w = batch["masked_lm_weights"][r] > 0
    ids[batch["masked_lm_positions"][r][w]] = batch["masked_lm_ids"][r][w]
    return ids.tobytes()


def test_dynamic_masks_are_a_function_of_seed_epoch_and_index(dynamic_source):
    src, batch_size, seed = dynamic_source, 16, 3
    n = len(src)
    index_of = {src[i]["input_ids"].tobytes(): i for i in range(n)}
    assert len(index_of) == n  # rows are distinct, so a row identifies its index
    it = pb.train_iterator(src, batch_size, seed)
    seen = {}  # (epoch, index) -> masked positions
    for step in range(-(-2 * n // batch_size) + 1):  # a little over two epochs
        batch = next(it)
        for r in range(batch_size):
            epoch, i = (step * batch_size + r) // n, index_of[_unmasked(batch, r)]
            # The row masked alone, from its own key, as in any other batch.
            alone = masking.mask_batch(src[i]["input_ids"][None],
                                        masking.masking_keys(seed, epoch, [i]), src.masking)
            for k, v in {**src[i], **{k: v[0] for k, v in alone.items()}}.items():
                np.testing.assert_array_equal(batch[k][r], v)
            seen[epoch, i] = batch["masked_lm_positions"][r]
    for epoch in (0, 1):  # every example exactly once per epoch
        assert sorted(i for e, i in seen if e == epoch) == list(range(n))
    same = [np.array_equal(seen[0, i], seen[1, i]) for i in range(n)]
    assert np.mean(same) < 0.2  # a new epoch draws new masks


def test_restored_iterator_repeats_the_next_batches(dynamic_source):
    it = pb.train_iterator(dynamic_source, 8, seed=5)
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(4)]
    restored = pb.train_iterator(dynamic_source, 8, seed=5)
    restored.set_state(state)
    for want in expected:
        got = next(restored)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    other_seed = next(pb.train_iterator(dynamic_source, 8, seed=6))
    assert not np.array_equal(other_seed["input_ids"], expected[0]["input_ids"])


@pytest.mark.parametrize("kind", ["static_source", "dynamic_source"])
def test_process_slices_partition_the_global_batch(kind, request):
    source = request.getfixturevalue(kind)
    full = pb.train_iterator(source, 8, seed=1)
    parts = [pb.train_iterator(source, 8, seed=1, process_index=p, process_count=4)
             for p in range(4)]
    for _ in range(3):
        batch = next(full)
        locals_ = [next(p) for p in parts]
        for k in batch:
            assert all(b[k].shape[0] == 2 for b in locals_)
            np.testing.assert_array_equal(np.concatenate([b[k] for b in locals_]), batch[k])
    assert set(batch) == {*pt.PretrainingSource(source.path)[0], "masked_lm_positions",
                          "masked_lm_ids", "masked_lm_weights"}
    with pytest.raises(ValueError, match="batch_size=6"):
        pb.train_iterator(source, 6, seed=1, process_count=4)


@pytest.mark.parametrize("kind", ["static_source", "dynamic_source"])
def test_eval_batches_cover_every_example_once_with_weighted_padding(kind, request):
    source = request.getfixturevalue(kind)
    n = len(source)
    batch_size = 10 if n % 10 else 12  # the last batch needs padding (and 2 processes share it)
    assert n % batch_size
    parts = [pb.eval_batches(source, batch_size, p, 2) for p in range(2)]
    whole = pb.eval_batches(source, batch_size)
    assert len(whole) == -(-n // batch_size)
    for step, batch in enumerate(whole):
        for k in batch:
            np.testing.assert_array_equal(
                np.concatenate([parts[0][step][k], parts[1][step][k]]), batch[k])
    weights = np.concatenate([b["example_weight"] for b in whole])
    np.testing.assert_array_equal(weights, [1.0] * n + [0.0] * (len(weights) - n))
    last = whole[-1]
    pad = last["example_weight"] == 0
    assert not last["input_ids"][pad].any() and not last["masked_lm_weights"][pad].any()
    rows = [_unmasked(b, r) for b in whole for r in range(batch_size)][:n]
    stored = [source[i] for i in range(n)]
    originals = [_unmasked({k: v[None] for k, v in row.items()}, 0) if "masked_lm_ids" in row
                 else row["input_ids"].tobytes() for row in stored]
    assert sorted(rows) == sorted(originals)


def _take(it, n):
    return [next(it) for _ in range(n)]


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            np.testing.assert_array_equal(g[k], w[k])


@pytest.mark.slow
def test_worker_processes_give_the_same_batches_restore_and_slice(dynamic_source):
    # One test for every worker property: each worker process costs ~1 s to start (spawn).
    src, batch_size, seed = dynamic_source, 8, 2
    want = _take(pb.train_iterator(src, batch_size, seed), 6)  # in-process threads
    # One worker, process 1 of 2: its half of each of the same global batches.
    second_half = pb.train_iterator(src, batch_size, seed, process_index=1, process_count=2,
                                    num_workers=1)
    _assert_same(_take(second_half, 6), [{k: v[4:] for k, v in w.items()} for w in want])
    two = pb.train_iterator(src, batch_size, seed, num_workers=2)
    _assert_same(_take(two, 3), want[:3])
    state = two.get_state()
    _assert_same(_take(two, 3), want[3:])
    restored = pb.train_iterator(src, batch_size, seed, num_workers=2)
    restored.set_state(state)
    _assert_same(_take(restored, 3), want[3:])
    for it in (second_half, two, restored):
        it.close()  # stop the workers now, not at interpreter exit
    with pytest.raises(ValueError, match="config.data.num_workers=-1"):
        pb.train_iterator(src, batch_size, seed, num_workers=-1)


def test_one_row_runs_are_the_old_pipelines_batches_bit_for_bit(dynamic_source):
    # The order before runs existed: grain range(n).shuffle(seed).repeat().batch(B), process 1
    # of 2 reading its half, masks keyed by (seed, epoch, index).
    src, batch_size, seed = dynamic_source, 16, 9
    n = len(src)
    old = grain.MapDataset.range(n).shuffle(seed=seed).repeat().batch(batch_size)
    it = pb.train_iterator(src, batch_size, seed, process_index=1, process_count=2, run_rows=1)
    for step in range(-(-2 * n // batch_size)):  # two epochs
        index = old[step][8:]
        want = src.read(index)
        epochs = (step * batch_size + np.arange(8, 16)) // n
        want.update(masking.mask_batch(want["input_ids"], masking.masking_keys(seed, epochs,
                                                                                index),
                                       src.masking, src.word_starts))
        got = next(it)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_a_position_resumes_on_another_process_count(dynamic_source, before, after):
    src, batch_size, seed, r = dynamic_source, 8, 4, 4
    whole = _take(pb.train_iterator(src, batch_size, seed, run_rows=r), 8)
    first = [pb.train_iterator(src, batch_size, seed, p, before, run_rows=r)
             for p in range(before)]
    for _ in range(3):
        for it in first:
            next(it)
    states = [it.get_state() for it in first]
    assert all(s == states[0] for s in states)  # the global batch index, the same everywhere
    resumed = [pb.train_iterator(src, batch_size, seed, p, after, run_rows=r)
               for p in range(after)]
    for it in resumed:
        it.set_state(states[0])
    for want in whole[3:]:
        parts = [next(it) for it in resumed]
        for k in want:
            np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), want[k])


def test_runs_keep_every_row_once_per_epoch_with_its_own_masks(dynamic_source):
    src, batch_size, seed = dynamic_source, 8, 3
    n = len(src)
    index_of = {src[i]["input_ids"].tobytes(): i for i in range(n)}
    it = pb.train_iterator(src, batch_size, seed, run_rows=4)
    seen = []
    for step in range(n // batch_size):  # the first epoch's full batches
        batch = next(it)
        for r in range(batch_size):
            i = index_of[_unmasked(batch, r)]
            alone = masking.mask_batch(src[i]["input_ids"][None],
                                       masking.masking_keys(seed, 0, [i]), src.masking)
            np.testing.assert_array_equal(batch["masked_lm_positions"][r],
                                          alone["masked_lm_positions"][0])
            seen.append(i)
    assert len(set(seen)) == len(seen) == n // batch_size * batch_size
    # Runs of 4 consecutive rows of a shard: most neighbours in the stream are neighbours on disk.
    assert np.mean(np.diff(seen) == 1) > 0.5
    with pytest.raises(ValueError, match="config.data.read_run_rows=0"):
        pb.train_iterator(src, batch_size, seed, run_rows=0)
