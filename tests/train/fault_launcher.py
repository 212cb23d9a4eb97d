"""train.py with one checkpoint fault injected, for tests/checkpoints/test_faults.py.

    python tests/train/fault_launcher.py --fault=KIND:STEP <train.py flags>

Faults live here, in the test harness, never in zoo/. KIND is one of:
  hang_commit  orbax writes every file of checkpoint STEP, then its commit (the rename of
               STEP.orbax-checkpoint-tmp to STEP) blocks forever, after writing
               <workdir>/HANG_MARKER: a test that sees the marker kills a process mid-save.
  file_limit   from the save of STEP on, no file may grow past FILE_LIMIT bytes (RLIMIT_FSIZE
               with SIGXFSZ ignored, so the write fails instead of the process dying): the C++
               writes of the arrays by tensorstore fail with EFBIG the way they fail with
               ENOSPC on a full disk, while the metrics log stays under the limit.
  hang_step    train step STEP never returns (the host sleeps inside it, as inside a wedged
               collective), after writing <workdir>/HANG_MARKER: the hang watchdog's case.
  hang_restore (STEP unused, 0) the restore of the latest checkpoint never returns, after
               writing <workdir>/HANG_MARKER: a phase before the loop, for the watchdog.
  fail_start   (STEP unused, 0) the job fails at once with a ConfigError, before its first
               collective, as for an init_from missing on one host.
  fail_step    train step STEP raises a RuntimeError (a bug), after many collectives.
With ZOO_FAULT_PROCESS=i in the environment, only process i gets the fault.
"""

import asyncio
import os
import resource
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax
import orbax.checkpoint as ocp
from absl import flags
from orbax.checkpoint._src.path import atomicity

import train
from zoo.commands import cli
from zoo.errors import ConfigError

HANG_MARKER = "fault_hanging"
# Tiny GPT checkpoints have array files of several hundred KiB; 200 steps of metrics.jsonl
# (log_every=1) stay under 60 KiB.
FILE_LIMIT = 96 * 1024

_FAULT = flags.DEFINE_string("fault", None, "KIND:STEP, KIND in hang_commit, file_limit, hang_step")
flags.mark_flag_as_required("fault")


def _mark(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)  # a test polling for it never reads half of it


def _hang_commit(step: int, workdir: str) -> None:
    original = atomicity.AtomicRenameTemporaryPath.finalize

    async def finalize(self):
        final = self.get_final()
        # The step directory itself, not its state/ and data/ items (committed before it).
        if final.name == str(step) and final.parent.name == "checkpoints":
            _mark(os.path.join(workdir, HANG_MARKER), str(self.get()))
            while True:
                await asyncio.sleep(3600)
        return await original(self)

    atomicity.AtomicRenameTemporaryPath.finalize = finalize


def _file_limit(step: int, workdir: str) -> None:
    del workdir
    original = ocp.CheckpointManager.save

    def save(self, at_step, *args, **kwargs):
        if at_step >= step:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, hard))
        return original(self, at_step, *args, **kwargs)

    ocp.CheckpointManager.save = save


def _hang_step(step: int, workdir: str) -> None:
    from zoo.train import loop

    original = loop.make_train_step

    def make_train_step(setup, config):
        train_step = original(setup, config)

        def hanging(state, batch):
            if int(state.step) + 1 == step:
                _mark(os.path.join(workdir, HANG_MARKER), str(step))
                while True:
                    time.sleep(3600)
            return train_step(state, batch)

        return hanging

    loop.make_train_step = make_train_step


def _hang_restore(step: int, workdir: str) -> None:
    del step
    from zoo.checkpoints import checkpoint

    def restore(self, *args, **kwargs):
        _mark(os.path.join(workdir, HANG_MARKER), "restore")
        while True:
            time.sleep(3600)

    checkpoint.Checkpointer.restore = restore


def _fail_start(step: int, workdir: str) -> None:
    del step
    raise ConfigError(f"config.train.init_from={workdir}/not-on-this-host is not a directory")


def _fail_step(step: int, workdir: str) -> None:
    del workdir
    from zoo.train import loop

    original = loop.make_train_step

    def make_train_step(setup, config):
        train_step = original(setup, config)

        def failing(state, batch):
            if int(state.step) + 1 == step:
                raise RuntimeError(f"injected failure in train step {step}")
            return train_step(state, batch)

        return failing

    loop.make_train_step = make_train_step


_FAULTS = {"hang_commit": _hang_commit, "file_limit": _file_limit, "hang_step": _hang_step,
           "hang_restore": _hang_restore, "fail_start": _fail_start, "fail_step": _fail_step}


def main(config, workdir):
    kind, _, step = _FAULT.value.partition(":")
    if kind not in _FAULTS or not step.isdigit():
        raise ValueError(f"--fault={_FAULT.value!r} must be KIND:STEP with KIND in "
                         f"{sorted(_FAULTS)}, e.g. --fault=hang_commit:100")
    only = os.environ.get("ZOO_FAULT_PROCESS")
    if only is None or int(only) == jax.process_index():
        _FAULTS[kind](int(step), os.path.abspath(workdir))
    return train.main(config, workdir)


if __name__ == "__main__":
    cli.run(main)
