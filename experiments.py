"""Run a grid of experiments and tabulate it: `python experiments.py grid=NAME [key=value ...]` (configs/grid/NAME.yaml;
see pipeline/grid.py)."""
import sys

from pipeline.grid import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
