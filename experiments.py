"""Run a grid of experiments and tabulate it.

Usage: `python experiments.py grid=NAME [key=value ...]` (configs/grid/NAME.yaml; see grid/engine.py).
`--dry-run` (or `--print-config`) is `action=list`: every cell's config composed and checked, the cells and their
state printed, nothing run or written.
"""

KEPT = "finished cells are kept: run the same command again to resume"  # what a stopped grid keeps, said at any stop

if __name__ == "__main__":  # first, before the imports (seconds): a signal during them ends as a later one does
    from core.signals import stop_early

    stop_early(KEPT)

import signal  # noqa: E402
import sys  # noqa: E402

from callbacks.preemption import EXIT_CODES, Interrupted, Signalled, raise_on_signals  # noqa: E402
from core.io import WriteFault  # noqa: E402
from grid.engine import main  # noqa: E402
from pipeline.cli import DRY_RUN, format_warnings  # noqa: E402
from pipeline.quiet import quiet_libraries  # noqa: E402


def run(argv: list[str]) -> int:
    """Run `grid.main` on `argv` and return its exit code, turning interrupts and refused writes into one line.

    SIGINT / SIGTERM exit 130 / 143 (a cell running in a subprocess is stopped with it; finished cells stay
    finished); a refused write exits 1.
    """
    quiet_libraries()  # for cells run in this process (launcher=inprocess); train.py / evaluate.py do it too
    format_warnings()
    try:
        raise_on_signals()  # inside the try: a signal just after it is this line too
        return main(argv)
    except Signalled as e:
        print(f"stopped: interrupted by {e}; {KEPT}", file=sys.stderr)
        return EXIT_CODES[e.signum]
    except Interrupted as e:  # a training cell run in this process (launcher=inprocess), stopped after its batch
        kept = "; the cell's last.ckpt is kept" if e.checkpoint else ""
        print(
            f"stopped: interrupted by {signal.Signals(e.signum).name} at step {e.step}{kept}; {KEPT}", file=sys.stderr
        )
        return e.code
    except WriteFault as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code


if __name__ == "__main__":
    argv = sys.argv[1:]
    if any(a in DRY_RUN for a in argv):
        argv = [*(a for a in argv if a not in DRY_RUN), "action=list"]
    sys.exit(run(argv))
