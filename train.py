"""Trains any zoo job: python train.py --config=configs/gpt.py:size=tiny --workdir=/tmp/gpt

A config with `stages` (configs/quickstart.py) trains each stage in turn (zoo.commands.pipeline)."""

from zoo.commands import cli, pipeline
from zoo.train import loop


def main(config, workdir):
    if pipeline.is_pipeline(config):
        return pipeline.train(config, workdir)
    return loop.run(config, workdir)


if __name__ == "__main__":
    cli.run(main)
