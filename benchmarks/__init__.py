"""Benchmarks run from the command line (`python -m benchmarks.<name>`); results go to
benchmarks/results/<machine>/ (see benchmarks.machine)."""
