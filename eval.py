"""Evaluates a trained workdir: python eval.py --config=configs/gpt.py:size=tiny --workdir=/tmp/gpt"""

from zoo import cli, evaluate

if __name__ == "__main__":
    cli.run(evaluate.run)
