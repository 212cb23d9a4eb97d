"""zoo: attention, Transformers, BERT, GPT and the RNNs they replaced, in JAX/Flax Linen."""

__version__ = "0.1.0"
