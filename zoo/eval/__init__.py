"""Metrics that reproduce their reference scripts exactly (SQuAD v1.1/v2.0 EM and F1)."""
