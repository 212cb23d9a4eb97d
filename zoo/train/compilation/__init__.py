"""The train step ahead of time and what it costs: lowering and compiling for hardware this
machine lacks (`export.py`, `aot.py`, the TPU `topologies.py`), the dry run (`dry_run.py`), the
collectives of a compiled program (`collectives.py`), FLOPs (`flops.py`) and each chip's peaks
(`chips.py`), and the persistent compilation cache (`compile_cache.py`)."""
