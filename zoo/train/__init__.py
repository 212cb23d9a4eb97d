"""The trainer: the one loop and its pure steps, partitioning, optimizers and the train state; its
rooms hosts/ (several processes and their failures) and compilation/ (the step ahead of time,
FLOPs, the compilation cache). It runs any task through the contract (zoo.contract) and imports
none."""
