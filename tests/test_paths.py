"""zoo.paths against a real GCS-API server on 127.0.0.1 (the `gcs` fixture): epath through
gcsfs, orbax's CheckpointManager through tensorstore, and the errors for buckets that cannot
be reached."""

import os

import numpy as np
import pytest

from zoo import errors, paths


def test_local_paths_keep_expanduser_and_become_absolute(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert os.fspath(paths.as_path("~/run")) == str(tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    assert os.fspath(paths.as_path("rel/x")) == str(tmp_path / "rel" / "x")
    assert not paths.is_remote("rel/x") and paths.is_remote("gs://b/x")
    assert paths.join("gs://b/run", "checkpoints", "3") == "gs://b/run/checkpoints/3"


def test_write_atomic_and_local_copy_round_trip_locally_and_in_a_bucket(gcs_bucket, tmp_path):
    for root in (str(tmp_path), gcs_bucket + "/dir"):
        target = paths.join(root, "sub", "f.bin")
        paths.write_atomic(target, b"old")
        paths.write_atomic(target, b"new bytes")
        assert paths.as_path(target).read_bytes() == b"new bytes"
        # No temporary files left beside it (locally the temp name is renamed away).
        assert [p.name for p in paths.as_path(target).parent.iterdir()] == ["f.bin"]
        with paths.local_copy(target) as local:
            assert not paths.is_remote(local)
            with open(local, "rb") as f:
                assert f.read() == b"new bytes"


def test_orbax_and_tensorstore_save_and_restore_in_the_bucket(gcs_bucket):
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    import tensorstore as ts

    store = ts.open({"driver": "zarr", "kvstore": f"{gcs_bucket}/ts/"}, create=True,
                    dtype=ts.int32, shape=[3]).result()
    store.write(np.array([4, 5, 6], np.int32)).result()
    assert paths.as_path(f"{gcs_bucket}/ts/.zarray").exists()  # tensorstore wrote the object

    state = {"w": jnp.arange(6.0).reshape(2, 3)}
    directory = paths.as_path(f"{gcs_bucket}/ckpt")
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
        max_to_keep=1, enable_async_checkpointing=True))
    for step in (1, 2):
        manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave({"w": state["w"] * step}),
            data=ocp.args.JsonSave({"position": step})))
    manager.wait_until_finished()
    manager.close()
    # A fresh manager (what a resumed process builds) sees only the kept, committed step;
    # orbax marks completeness on GCS with commit_success.txt instead of a rename.
    manager = ocp.CheckpointManager(directory)
    assert manager.all_steps() == [2]
    assert (directory / "2" / "commit_success.txt").exists()
    restored = manager.restore(2, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(state), data=ocp.args.JsonRestore()))
    np.testing.assert_array_equal(restored["state"]["w"], state["w"] * 2)
    assert restored["data"] == {"position": 2}
    manager.close()


def test_tensorstore_sees_object_generations_so_its_conditional_writes_work(gcs_bucket):
    # What OCDBT (orbax's array store) does to update a checkpoint's manifest: read an object,
    # then replace it only if it is still the version read. Needs the x-goog-generation header
    # the test server adds (tests/gcs_server.py).
    import tensorstore as ts

    store = ts.KvStore.open(f"{gcs_bucket}/kv/").result()
    store.write("manifest", b"v1").result()
    read = store.read("manifest").result()
    assert read.stamp.generation != b"\0" * len(read.stamp.generation)
    store.write("manifest", b"v2", if_equal=read.stamp.generation).result()
    assert store.read("manifest").result().value == b"v2"


def test_a_missing_bucket_is_one_error_naming_the_key(gcs):
    paths.check_remote(f"gs://{gcs.bucket()}/run", "--workdir")  # an existing one passes
    with pytest.raises(errors.MissingFileError, match=r"--workdir=gs://no-such-bucket/run: "
                                                      r"bucket no-such-bucket does not exist"):
        paths.check_remote("gs://no-such-bucket/run", "--workdir")


def test_an_unreachable_server_is_one_error_in_seconds(gcs, monkeypatch):
    from tests.gcs_server import free_port

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(errors.UserError, match=r"config.data.cache_dir=gs://b/x: cannot connect "
                                               r"to 127.0.0.1:\d+ .*emulator running"):
        paths.check_remote("gs://b/x", "config.data.cache_dir")


def test_move_tree_moves_every_object_of_a_directory_in_a_bucket(gcs_bucket):
    src = paths.as_path(f"{gcs_bucket}/checkpoints/7")
    for name, data in {"a": b"1", "state/b": b"22", "state/deep/c": b"333"}.items():
        paths.write_atomic(src / name, data)
    paths.move_tree(src, f"{gcs_bucket}/checkpoints_corrupt/7")
    moved = paths.as_path(f"{gcs_bucket}/checkpoints_corrupt/7")
    assert (moved / "state/deep/c").read_bytes() == b"333" and (moved / "a").read_bytes() == b"1"
    assert not src.exists()
