"""A tiny BERT pretraining that lives in a bucket on a real GCS-API server (127.0.0.1, the `gcs`
fixture), run as a user runs it on a pod: the corpus in the bucket, `python -m
zoo.commands.prepare` writing the tokenizer and the shards into the bucket, train.py from them
with its workdir there, SIGKILL, the same command again, eval.py from the bucket. It must equal a
run on local disk that never stopped, bit for bit: gs:// changes where bytes go, never which."""

import json
import re
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from tests.train import gpt_process
from zoo import paths

ROOT = gpt_process.ROOT
STEPS, EVERY = 60, 20
ARGS = ["--config=configs/bert_pretrain.py:size=tiny", "--config.data.source=files",
        "--config.data.shard_mb=0.01", "--config.data.vocab_size=512", "--config.data.dupe_factor=1",
        f"--config.train.steps={STEPS}", f"--config.train.checkpoint_every={EVERY}",
        "--config.train.log_every=1", f"--config.train.eval_every={STEPS}",
        "--config.train.keep_checkpoints=5"]


def _command(script, workdir, data, *extra):
    """`script` (a file, or -m and a module) on the corpus and prepared directory under `data`."""
    start = [script] if script.startswith("-m") else [os.path.join(ROOT, script)]
    return [sys.executable, *start[0].split(" "), *ARGS, f"--workdir={workdir}",
            f"--config.data.train_files={data}/train.txt",
            f"--config.data.eval_files={data}/validation.txt",
            f"--config.data.prepared_dir={data}/prepared", *extra]


def _corpus(root) -> None:
    from zoo.data.readers import text_files
    from zoo.data.synthetic.documents import corpus_splits

    splits = corpus_splits(seed=0, num_entities=200)
    if not paths.is_remote(root):
        os.makedirs(root, exist_ok=True)
    for split in ("train", "validation"):
        text_files.write_text_corpus(f"{root}/{split}.txt", splits[split])


def _files(root) -> dict[str, bytes]:
    import fsspec

    if paths.is_remote(root):
        base = root.split("://", 1)[1]
        return {n[len(base) + 1:]: paths.as_path("gs://" + n).read_bytes()
                for n in fsspec.filesystem("gs").find(base)}
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, names in os.walk(root) for f in names}


def _run(script, workdir, cache, *extra):
    proc = subprocess.run(_command(script, workdir, cache, *extra), cwd=ROOT,
                          env=gpt_process.env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def _scalar_steps(data: bytes, tag: str) -> list[int]:
    """The steps of `tag` in a TensorBoard event file (TFRecord framing: length, its CRC, the
    Event proto, its CRC)."""
    from tensorboardX.proto import event_pb2

    steps, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
        offset += 12 + length + 4
        steps += [event.step for value in event.summary.value if value.tag == tag]
    return steps


@pytest.mark.acceptance
def test_bert_in_a_bucket_killed_and_resumed_equals_a_local_run(gcs, gcs_bucket, tmp_path):
    data, cloud_data = str(tmp_path / "data"), f"{gcs_bucket}/data"
    for root in (data, cloud_data):
        _corpus(root)
        _run("-m zoo.commands.prepare", f"{root}/prep-workdir", root)
    # The bucket's preparation is the local one, byte for byte (the plans differ: they name
    # other files); training only reads it from here on.
    local_files, cloud_files = _files(f"{data}/prepared"), _files(f"{cloud_data}/prepared")
    assert sorted(local_files) == sorted(cloud_files)
    assert sum(n.startswith("train/shard-") for n in local_files) > 1
    differ = sorted(n for n in local_files if local_files[n] != cloud_files[n])
    # Only what names the input files: the plans and the shard markers' piece descriptions.
    assert all(n.endswith("plan.json") or "/shard-" in n for n in differ), differ
    for n in differ:
        if "/shard-" in n:
            local_marker, cloud_marker = json.loads(local_files[n]), json.loads(cloud_files[n])
            assert local_marker.pop("piece") != cloud_marker.pop("piece")
            assert local_marker == cloud_marker
    local = str(tmp_path / "local")
    _run("train.py", local, data, "--config.train.tensorboard=false")
    cloud = f"{gcs_bucket}/runs/bert"
    extra = ("--config.train.tensorboard=true",)

    started = time.time()
    proc = subprocess.Popen(_command("train.py", cloud, cloud_data, *extra), cwd=ROOT,
                            env=gpt_process.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # Killed between the first and second checkpoints: once step EVERY's checkpoint has
    # committed, not merely once training is past it (the save is asynchronous, and to a
    # bucket its commit can trail the steps: CI once killed the run at step 25 with step 20
    # still uncommitted, and the rerun rightly started from 0). Step 2 x EVERY's save waits
    # for that commit before it starts, so it cannot have committed yet.
    committed = paths.as_path(cloud) / "checkpoints" / str(EVERY) / "commit_success.txt"
    while time.time() - started < 300:
        records = gpt_process.logged_steps(cloud)
        if records and records[-1]["step"] >= EVERY + 5 and committed.exists():
            break
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = gpt_process.logged_steps(cloud)[-1]["step"]
    assert EVERY < killed_at < STEPS, killed_at

    resumed = _run("train.py", cloud, cloud_data, *extra)
    assert f"starting at step {EVERY}" in resumed.stdout, resumed.stdout[:1000]
    # Every step's loss, and the final train state, exactly the local run's.
    gpt_process.assert_identical_runs(cloud, local, STEPS)
    root = paths.as_path(cloud)
    # The final eval bit for bit; "goodput" is each run's own wall-time account.
    cloud_summary = json.loads((root / "summary.json").read_text())
    local_summary = json.load(open(os.path.join(local, "summary.json")))
    assert cloud_summary.pop("goodput")["runs"] == 2 and local_summary.pop("goodput")
    assert cloud_summary == local_summary
    # Committed on GCS with orbax's commit file (no rename there), every kept step listed.
    steps = sorted(int(p.name) for p in (root / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [EVERY, 2 * EVERY, STEPS]
    assert all((root / "checkpoints" / str(s) / "commit_success.txt").exists() for s in steps)
    # TensorBoard in the bucket: tensorboardX uploads an event file when it flushes (every 2
    # minutes, and at exit), so the killed process left none; the resumed one logged its steps.
    events = list((root / "tensorboard").iterdir())
    assert len(events) == 1, events
    assert _scalar_steps(events[0].read_bytes(), "train/loss") == list(range(EVERY + 1, STEPS + 1))

    evaluated = _run("eval.py", cloud, cloud_data)
    result = json.loads((root / "eval.json").read_text())
    assert result["step"] == STEPS
    assert result["mlm_accuracy"] == pytest.approx(
        json.load(open(os.path.join(local, "summary.json")))["mlm_accuracy"], rel=1e-6)
    assert "mlm_accuracy" in evaluated.stdout


@pytest.mark.acceptance
def test_a_job_on_a_silent_bucket_ends_within_its_storage_bound(gcs_knobs, gcs_bucket):
    """A bucket that takes every connection and never answers a read: the job ends with one
    error naming the object within config.train.storage's bound (1 s requests, a 10 s budget:
    one attempt of gcsfs's 6 requests and its ~31 s of backoff, then no second attempt).
    Before: with no request timeout, tiny BERT on such a bucket printed nothing for 300 s."""
    data = f"{gcs_bucket}/data"
    _corpus(data)
    gcs_knobs.fail("silent", count=10_000, op="read")
    started = time.monotonic()
    proc = subprocess.run(
        _command("train.py", f"{gcs_bucket}/runs/silent", data,
                 "--config.train.storage.request_timeout_s=1",
                 "--config.train.storage.operation_budget_s=10",
                 "--config.data.prepared_dir="),  # prepared in the job: it reads the corpus
        cwd=ROOT, env=gpt_process.env(), capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, (proc.stdout[-2000:], proc.stderr[-3000:])
    last = proc.stderr.strip().splitlines()[-1]
    assert re.match(r"error: \w+ gs://\S+: failed once over \d+ s with errors that usually "
                    r"pass \(last: .*request_timeout_s.*\); another attempt would end past the "
                    r"10 s budget", last), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert elapsed < 120, elapsed
