"""Layers with no task knowledge: attention, masks, embeddings, feed-forward, Transformer, RNNs."""
