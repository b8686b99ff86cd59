"""Runs an entry script (train.py, evaluate.py, experiments.py) that signals itself at one point of its work, as a
user's Ctrl-C or a scheduler's SIGTERM would arrive there (tests/test_faults_writes.py):

    POINT=data SIG=SIGINT SCRIPT=evaluate.py python tests/fault_points.py key=value ...
    POINT=forward ...          # inside the first forward pass of the backbone (BertModel.forward)
    POINT=write:run.trec ...   # while a file whose path holds 'run.trec' is being written (at its fsync, before
                               # its rename): the result set is half staged
    POINT=cell ...             # experiments.py: when the first cell starts

Test-only: the pipeline has no fault hooks; this wraps library functions from outside. os.kill on our own pid runs
the Python-level handler at the next bytecode, so the signal lands deterministically at the chosen point.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _fire() -> None:
    if os.environ.get("FAULT_FIRED") == "1":
        return
    os.environ["FAULT_FIRED"] = "1"
    if os.environ.get("FAULT_DEBUG"):
        import traceback

        traceback.print_stack(limit=12)
    os.kill(os.getpid(), signal.Signals[os.environ["SIG"]])


def at_data() -> None:
    from datamodules.corpus import IRDataset

    real = IRDataset.validate

    def validate(self, *a, **k):
        out = real(self, *a, **k)
        _fire()
        return out

    IRDataset.validate = validate


def at_forward() -> None:
    from transformers.models.bert import modeling_bert

    real = modeling_bert.BertModel.forward

    def forward(self, *a, **k):
        _fire()
        return real(self, *a, **k)

    modeling_bert.BertModel.forward = forward


def at_write(part: str) -> None:
    real = os.fsync

    def fsync(fd):
        real(fd)
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if part in name:
            _fire()

    os.fsync = fsync


def at_cell() -> None:
    import grid.engine

    real = grid.engine.run_cell

    def run_cell(cell, spec, on_start=lambda: None):
        def started():
            on_start()
            _fire()

        return real(cell, spec, started)

    grid.engine.run_cell = run_cell


def main() -> None:
    point, script = os.environ["POINT"], os.environ["SCRIPT"]
    if point == "data":
        at_data()
    elif point == "forward":
        at_forward()
    elif point.startswith("write:"):
        at_write(point.split(":", 1)[1])
    elif point == "cell":
        at_cell()
    else:
        raise SystemExit(f"unknown point {point!r}")
    path = REPO / script
    sys.argv = [str(path), *sys.argv[1:]]
    exec(compile(path.read_text(), str(path), "exec"), {"__name__": "__main__", "__file__": str(path)})


if __name__ == "__main__":
    main()
