"""Trains any zoo task: python train.py --config=configs/gpt.py:size=tiny --workdir=/tmp/gpt"""

from zoo import cli
from zoo.train import loop

if __name__ == "__main__":
    cli.run(loop.run)
