"""Every test runs on 8 fake CPU devices, so sharded paths are testable without accelerators."""

import os

# Must be set before jax is imported anywhere: the CPU backend reads it once at start-up.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
