"""CPU kernels of our own, in C++, called from jitted JAX code through XLA's FFI.

The sources live beside this file; `build.compiled` compiles one with the machine's C++
compiler on first use (for the CPU it runs on) and caches the shared library.
"""
