"""Readers of real data (local files, TFDS) and their featurizers, one module per task."""
