"""The environment of a process a test starts (train.py, eval.py, a `python -m zoo...` command,
a launcher): the suite's own, on a number of fake CPU devices of its choosing.

It keeps the rest of the suite's XLA_FLAGS: the fast tier's cheap code generation (conftest:
LLVM -O0 and XLA's elemental emitters; the few steps such a process runs are compile-bound, as
the in-process tests are) and whatever .ci/run's reordered step set (so a process rounds as the
test around it does), and the compilation cache every process shares. The acceptance tier,
which trains for thousands of steps, has no such flags to hand on.
"""

import os
import re


def process_env(devices: int = 1, **extra: str) -> dict:
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                   os.environ.get("XLA_FLAGS", ""))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{flags.strip()} --xla_force_host_platform_device_count={devices}")
    env.update(extra)
    return env
