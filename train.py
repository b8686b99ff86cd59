"""Fine-tune a ranker: `python train.py [group=option ...] [key=value ...]` (see configs/ and docs/configuration.md)."""

import sys

from pipeline.cli import main
from pipeline.run import train

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], lambda cfg, _: train(cfg)))
