"""Evaluates a trained workdir: python eval.py --config=configs/gpt.py:size=tiny --workdir=/tmp/gpt"""

from zoo.commands import cli, jobs, pipeline


def main(config, workdir):
    if pipeline.is_pipeline(config):
        return pipeline.evaluate_all(config, workdir)
    return jobs.evaluate(config, workdir)


if __name__ == "__main__":
    cli.run(main)
