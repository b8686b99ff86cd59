"""Run a grid of experiments and tabulate it: `python experiments.py grid=NAME [key=value ...]` (configs/grid/NAME.yaml;
see pipeline/grid.py). `--dry-run` (or `--print-config`) is `action=list`: every cell's config composed and checked, the
cells and their state printed, nothing run or written."""
import sys

from pipeline.cli import DRY_RUN
from pipeline.grid import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if any(a in DRY_RUN for a in argv):
        argv = [*(a for a in argv if a not in DRY_RUN), "action=list"]
    sys.exit(main(argv))
