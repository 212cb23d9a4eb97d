"""Example preparation, caching and batching: LM rows, BERT pretraining examples, grain."""
