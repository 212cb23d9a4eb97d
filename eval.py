"""Evaluates a trained workdir: python eval.py --config=configs/gpt.py:size=tiny --workdir=/tmp/gpt"""

from zoo.commands import cli, jobs, stages


def main(config, workdir):
    if stages.is_pipeline(config):
        return stages.evaluate_all(config, workdir)
    return jobs.evaluate(config, workdir)


if __name__ == "__main__":
    cli.run(main)
