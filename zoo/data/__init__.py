"""Host-side data: tokenizers, sources (TFDS, local files, the synthetic world), featurizers."""
