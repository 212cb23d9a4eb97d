"""A run's step checkpoints, on local disk or in a bucket: orbax saves and restores with the data
iterator's position (`checkpoint.py`, `data_position.py`), per-file checksums (`checksums.py`),
a damaged step set aside (`quarantine.py`), and the restore decision every process of a pod agrees
on (`restore_verdicts.py`, the failures it names in `checkpoint_failures.py`). Below the trainer
and the tasks: the loop saves and resumes through it, and a fine-tuning task reads a run's
parameter shapes from it."""
