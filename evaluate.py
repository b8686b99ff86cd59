"""Evaluate a checkpoint (or an untrained backbone): `python evaluate.py ckpt=PATH data=cranfield [key=value ...]`."""

import sys

from pipeline.cli import main
from pipeline.run import evaluate

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], evaluate))
