"""Trains any zoo job: python train.py --config=configs/gpt.py:size=tiny --workdir=/tmp/gpt

zoo.commands.jobs.train looks config.task up and runs the one loop; a config with `stages`
(configs/quickstart.py) trains each stage in turn (zoo.commands.pipeline)."""

from zoo.commands import cli, jobs, pipeline


def main(config, workdir):
    if pipeline.is_pipeline(config):
        return pipeline.train(config, workdir)
    return jobs.train(config, workdir)


if __name__ == "__main__":
    cli.run(main)
