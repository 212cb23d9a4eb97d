"""The seeded offline data: the synthetic "world" corpus and the task sets built over it."""
