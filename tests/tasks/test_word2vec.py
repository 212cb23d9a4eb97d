"""The word2vec job end to end on the synthetic world: train through the one loop, evaluate,
query neighbours and analogies, export the kept `embedding` table in the word2vec format."""

import json
import os

import jax
import numpy as np
import pytest

from configs import word2vec as word2vec_config
from zoo.commands import word2vec_query
from zoo.data.synthetic.world import make_world
from zoo.tasks import word2vec as w2v_task

# One device: nothing here is about sharding (tests/train/test_loop.py covers the layouts),
# and 8 fake devices only add compile and collective time.
ONE_DEVICE = jax.devices()[:1]


def _config(mode, steps):
    config = word2vec_config.get_config(f"size=tiny,mode={mode}")
    config.train.update(steps=steps, log_every=25, eval_every=steps, checkpoint_every=steps,
                        tensorboard=False)
    config.sample.num_neighbours = 4
    return config


def _train(tmp_path_factory, mode, steps):
    from zoo import tasks
    from zoo.commands import jobs  # after conftest's XLA_FLAGS

    tasks._REGISTRY.setdefault("word2vec", "zoo.tasks.word2vec:Word2VecTask")
    workdir = str(tmp_path_factory.mktemp(mode))
    config = _config(mode, steps)
    jobs.train(config, workdir, devices=ONE_DEVICE)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return config, workdir, records


def _summary(workdir):
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def skipgram(tmp_path_factory):
    # The config's own 300 steps: at 150 the analogy below (its first three answers
    # languages) held for 1 of train.seed 0-3 with the base class's batch iterator and for 2
    # with the task's own; at 300 the first two are languages for all four.
    return _train(tmp_path_factory, "skipgram", 300)


def _check_training(workdir, records):
    train = [r for r in records if r["split"] == "train"]
    # At step 0 every output word costs log 2 (zero context vectors): 6 log 2 = 4.16.
    assert train[-1]["loss"] < train[0]["loss"] - 0.5
    assert train[-1]["loss"] < 6 * np.log(2) - 1.5
    summary = _summary(workdir)
    assert summary["loss"] < 6 * np.log(2) - 1.0  # held-out pairs too
    # Entity words of one type cluster: purity far above random vectors' (~1 / 5 types).
    assert summary["random_neighbour_purity"] < 0.3
    assert summary["neighbour_purity"] > summary["random_neighbour_purity"] + 0.4


@pytest.mark.slow
def test_skipgram_loss_falls_and_neighbours_recover_the_entity_types(skipgram):
    _, workdir, records = skipgram
    _check_training(workdir, records)


def test_cbow_loss_falls_and_neighbours_recover_the_entity_types(tmp_path_factory):
    _, workdir, records = _train(tmp_path_factory, "cbow", 100)
    _check_training(workdir, records)


def test_neighbour_purity_counts_same_type_neighbours():
    # Two tight clusters of two words: every nearest neighbour shares the type.
    vectors = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]])
    assert w2v_task.neighbour_purity(vectors, np.array([0, 0, 1, 1]), 1) == {
        "macro": 1.0, "micro": 1.0}
    # Labels across the clusters: no neighbour shares the type.
    assert w2v_task.neighbour_purity(vectors, np.array([0, 1, 0, 1]), 1)["macro"] == 0.0
    # k=2 with three of type 0 and one of type 1: macro weighs the types equally.
    labels = np.array([0, 0, 0, 1])
    vectors = np.array([[1, 0], [0.95, 0.05], [0.9, 0.1], [0, 1]])
    purity = w2v_task.neighbour_purity(vectors, labels, 2)
    # type 0 words: 2 of 2 neighbours are type 0; the type 1 word: 0 of 2.
    assert purity == {"macro": pytest.approx(0.5), "micro": pytest.approx(0.75)}


def test_train_batches_are_whole_shuffled_epochs_and_resume(tmp_path):
    """The task's own iterator (one numpy permutation per epoch): each epoch trains every row
    at most once (a last partial batch left out), epochs differ, two processes' slices make
    the global batch, and a restored position continues the same stream."""
    from zoo.checkpoints import data_position

    config = _config("skipgram", 1)
    config.data.batch_size = 64
    task = w2v_task.Word2VecTask(config, str(tmp_path))
    n = 1000
    task.train_rows = {"inputs": np.zeros((n, 1), np.int32),
                       "input_weights": np.ones((n, 1), np.float32),
                       "targets": np.arange(n, dtype=np.int32),  # each row's own index
                       "weights": np.ones(n, np.float32)}
    per_epoch = n // 64
    stream = task.train_batches(0, 1)
    epochs = [np.concatenate([next(stream)["targets"] for _ in range(per_epoch)])
              for _ in range(2)]
    for rows in epochs:
        assert len(rows) == len(set(rows.tolist())) == per_epoch * 64
    assert not np.array_equal(epochs[0], epochs[1])
    halves = [task.train_batches(p, 2) for p in (0, 1)]
    np.testing.assert_array_equal(
        np.concatenate([next(h)["targets"] for h in halves]), epochs[0][:64])
    # Resume: the position after 5 batches, set on a fresh iterator, gives batch 6.
    stream = task.train_batches(0, 1)
    for _ in range(5):
        next(stream)
    position = stream.get_state()
    resumed = task.train_batches(0, 1)
    data_position.set_position(resumed, position)
    np.testing.assert_array_equal(next(resumed)["targets"], epochs[0][5 * 64:6 * 64])
    task.config.data.batch_size = n + 1
    with pytest.raises(ValueError, match="batch_size=1001 exceeds the 1,000 training rows"):
        task.train_batches(0, 1)


def test_bad_config_values_are_named(tmp_path):
    config = _config("skipgram", 1)
    config.sample.words = "vanomistan,qwzx"
    with pytest.raises(ValueError, match="config.sample.words: word 'qwzx'"):
        w2v_task.Word2VecTask(config, str(tmp_path))
    config = _config("skipgram", 1)
    config.data.negatives = 0
    with pytest.raises(ValueError, match="config.data.negatives=0"):
        w2v_task.Word2VecTask(config, str(tmp_path))


def _query(config, workdir, *flags):
    return word2vec_query.main(["word2vec_query", "--config=configs/word2vec.py:size=tiny",
                                f"--workdir={workdir}", *flags])


@pytest.fixture(scope="module")
def tables(skipgram):
    """The checkpoint's vocabulary and tables, restored independently of word2vec_query."""
    from zoo.commands import jobs
    from zoo.checkpoints.checkpoint import Checkpointer

    config, workdir, _ = skipgram
    setup = jobs.build(config, workdir, devices=ONE_DEVICE)
    checkpointer = Checkpointer(workdir)
    params = checkpointer.restore_params(setup.state.params)
    checkpointer.close()
    return setup.task.vocab, np.asarray(params["embedding"]), np.asarray(params["context"])


def test_export_round_trips_the_embedding_table(skipgram, tables, tmp_path):
    config, workdir, _ = skipgram
    vocab, embedding, context = tables
    path = str(tmp_path / "vectors.txt")
    _query(config, workdir, f"--export={path}")
    with open(path, encoding="utf-8") as f:
        assert f.readline() == f"{len(vocab)} 32\n"
        assert f.readline().split(" ")[0] == vocab.words[0]  # "word v1 ... vD", most frequent
    words, table = word2vec_query.read_vectors(path)
    assert tuple(words) == vocab.words
    np.testing.assert_array_equal(table, embedding)  # exact: 9 digits round-trip float32
    assert not np.allclose(table, context)  # the context table is discarded, not exported


def test_binary_export_round_trips(tables, tmp_path):
    vocab, embedding, _ = tables
    path = str(tmp_path / "vectors.bin")
    word2vec_query.write_vectors(path, vocab.words, embedding, binary=True)
    with open(path, "rb") as f:
        assert f.readline() == f"{len(vocab)} 32\n".encode()
        # The first record: the word, a space, 32 little-endian float32.
        record = f.read(len(vocab.words[0]) + 1 + 4 * 32 + 1)
    assert record.startswith(vocab.words[0].encode() + b" ") and record.endswith(b"\n")
    np.testing.assert_array_equal(np.frombuffer(record[-129:-1], "<f4"), embedding[0])
    words, table = word2vec_query.read_vectors(path, binary=True)
    assert tuple(words) == vocab.words
    np.testing.assert_array_equal(table, embedding)


def test_queries_answer_from_the_trained_vectors(skipgram):
    config, workdir, _ = skipgram
    result = _query(config, workdir, "--neighbours=Vanomistan", "--k=5",
                    "--analogy=vanomistan,vanomese,bratrothland")
    near = result["neighbours"]["Vanomistan"]
    assert len(near) == 5 and "vanomistan" not in [w for w, _ in near]
    assert [s for _, s in near] == sorted((s for _, s in near), reverse=True)
    world = make_world(config.data.seed, config.data.synthetic_entities)
    type_of = {e.name.lower(): e.type for e in world.entities}
    # Countries are 25 of ~760 words; at least 2 of the 5 nearest is far above chance (0.15).
    assert sum(type_of.get(w) == "country" for w, _ in near) >= 2, near
    # "a country is to its language as another country is to ?": languages come first.
    answers = [w for w, _ in result["analogy"]]
    assert len(answers) == 5 and not {"vanomistan", "vanomese", "bratrothland"} & set(answers)
    kinds = [type_of.get(w) for w in answers]
    assert kinds[:2] == ["language"] * 2 and kinds.count("language") >= 3, answers


def test_query_errors_name_the_problem(skipgram, tmp_path):
    config, workdir, _ = skipgram
    with pytest.raises(ValueError, match="word 'nosuchword' is not in the vocabulary"):
        _query(config, workdir, "--neighbours=vanomistan", "--analogy=poria,vanomese,nosuchword")
    with pytest.raises(ValueError, match="exactly three words"):
        _query(config, workdir, "--analogy=vanomistan,vanomese")
    with pytest.raises(ValueError, match="nothing to do"):
        _query(config, workdir)
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        _query(config, str(tmp_path), "--neighbours=vanomistan")


def test_eval_reproduces_the_final_summary(skipgram):
    from zoo.commands import jobs

    config, workdir, _ = skipgram
    result = jobs.evaluate(config, workdir, devices=ONE_DEVICE)
    summary = _summary(workdir)
    assert result["step"] == 300
    assert result["neighbour_purity"] == pytest.approx(summary["neighbour_purity"])
    assert result["loss"] == pytest.approx(summary["loss"], rel=1e-5)
