"""Prepares a BERT pretraining job's data (or a SQuAD job's features) once, then exits; train.py
with the same config only reads it (never re-tokenizes).

    python -m zoo.commands.prepare --config=configs/bert_pretrain.py:size=base \\
        --workdir=gs://BUCKET/run --config.data.prepared_dir=gs://BUCKET/bert-data \\
        --config.data.source=files --config.data.train_files='gs://BUCKET/corpus/*.txt' ...

The corpus is streamed piece by piece (config.data.shard_mb of text, or config.data.num_shards
groups of a TFDS split) by config.data.prepare_workers processes per host (0 = every core); run
on every host of a pod, the hosts share the shards and wait for each other. Killed, it is
simply run again: finished shards are kept. Without config.data.prepared_dir the data goes
where the job would prepare it itself (keyed under config.data.cache_dir, else <workdir>/data).
"""

import time

import jax

from zoo.commands import cli
from zoo.data import corpora
from zoo.data.pipelines.pretraining import job_data as pretraining_data
from zoo.errors import ConfigError
from zoo.tasks import squad
from zoo.tasks.base import data_cache_dir


def main(config, workdir: str) -> None:
    if config.task == "squad":
        return _prepare_squad(config, workdir)
    if config.task != "mlm_nsp":
        raise ConfigError(
            f"config.task={config.task!r}: the prepare command prepares BERT pretraining data "
            "(configs/bert_pretrain.py, task 'mlm_nsp') and SQuAD features (configs/squad.py); "
            "other jobs prepare their data themselves when train.py starts")
    data = config.data
    corpora.check_fetched(data)
    index, count = jax.process_index(), jax.process_count()
    prefix = f"prepare [process {index}/{count}]" if count > 1 else "prepare"

    def report(line: str) -> None:
        print(f"{prefix}: {line}", flush=True)

    where = data.prepared_dir or data_cache_dir(config, workdir)
    report(f"preparing {data.source!r} data into {where} with "
           f"{data.prepare_workers or 'every core'} workers per process")
    start = time.perf_counter()
    prepared = pretraining_data.prepare(
        data, data_cache_dir(config, workdir), data.prepared_dir, workers=data.prepare_workers,
        process_index=index, process_count=count, report=report)
    for name, source in (("train", prepared.train), ("validation", prepared.validation)):
        report(f"{name}: {len(source):,} examples in {len(source.manifest['shard_rows'])} "
               f"shards at {source.path}")
    report(f"done in {time.perf_counter() - start:.1f} s; train with the same flags"
           + (" (config.data.prepared_dir set)" if data.prepared_dir else ""))


def _prepare_squad(config, workdir: str) -> None:
    if not config.data.prepared_dir:
        raise ConfigError("config.data.prepared_dir is empty: give the directory (local or "
                          "gs://) to write the SQuAD features into")
    start = time.perf_counter()
    if jax.process_index() == 0:  # one pass over SQuAD is minutes at most: no sharing needed
        settings = squad.prepare_data(config, workdir, config.data.prepared_dir)
        print(f"prepare: {settings['train_windows']:,} train and "
              f"{settings['validation_windows']:,} validation windows at "
              f"{config.data.prepared_dir} in {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    cli.run(main)
