"""Training: partitioning, optimizers, losses, train state, pure steps and the one loop."""
