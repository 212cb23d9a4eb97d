"""Trains any zoo job: python train.py --config=configs/gpt.py:size=tiny --workdir=/tmp/gpt

zoo.commands.jobs.train looks config.task up and runs the one loop; a config with `stages`
(configs/quickstart.py) trains each stage in turn (zoo.commands.stages)."""

from zoo.commands import cli, jobs, stages


def main(config, workdir):
    if stages.is_pipeline(config):
        return stages.train(config, workdir)
    return jobs.train(config, workdir)


if __name__ == "__main__":
    cli.run(main)
