"""Run a grid of experiments and tabulate it.

Usage: `python experiments.py grid=NAME [key=value ...]` (configs/grid/NAME.yaml; see grid/engine.py).
`--dry-run` (or `--print-config`) is `action=list`: every cell's config composed and checked, the cells and their
state printed, nothing run or written.
"""

import sys

from callbacks.preemption import EXIT_CODES, Signalled, raise_on_signals
from core.io import WriteFault
from grid.engine import main
from pipeline.cli import DRY_RUN


def run(argv: list[str]) -> int:
    """Run `grid.main` on `argv` and return its exit code, turning interrupts and refused writes into one line.

    SIGINT / SIGTERM exit 130 / 143 (a cell running in a subprocess is stopped with it; finished cells stay
    finished); a refused write exits 1.
    """
    raise_on_signals()
    try:
        return main(argv)
    except Signalled as e:
        print(
            f"stopped: interrupted by {e}; finished cells are kept: run the same command again to resume",
            file=sys.stderr,
        )
        return EXIT_CODES[e.signum]
    except WriteFault as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code


if __name__ == "__main__":
    argv = sys.argv[1:]
    if any(a in DRY_RUN for a in argv):
        argv = [*(a for a in argv if a not in DRY_RUN), "action=list"]
    sys.exit(run(argv))
