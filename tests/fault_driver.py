"""Runs train.py / evaluate.py with one injected fault, as a separate process (what a scheduler or the kernel would
do to a real job):

    python tests/fault_driver.py signal:SIGTERM:5 train.py key=value ...   # the process signals itself after step 5
    python tests/fault_driver.py kill-in-write:last.ckpt:2 train.py ...    # SIGKILL half-way through the 2nd write of last.ckpt

Test-only: the pipeline itself has no fault hooks; this wraps its Trainer and file writes from outside.
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def signal_at_step(sig: signal.Signals, step: int) -> None:
    import pipeline.run
    from pytorch_lightning import Callback

    class SendSignal(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == step:
                os.kill(os.getpid(), sig)  # handled between bytecodes, so before the next hook runs

    build = pipeline.run.build_trainer

    def with_signal(*args, **kwargs):
        trainer = build(*args, **kwargs)
        trainer.callbacks.append(SendSignal())
        return trainer

    pipeline.run.build_trainer = with_signal


def kill_in_write(name: str, nth: int) -> None:
    """The nth atomic write of a file called `name` dies (SIGKILL) after writing half of its bytes."""
    import pipeline.io

    real = pipeline.io.atomic_open
    count = {"n": 0}

    class HalfThenDie:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        def __getattr__(self, k):
            return getattr(self.f, k)

    from contextlib import contextmanager

    @contextmanager
    def dying(path, mode="w"):
        with real(path, mode) as f:
            if Path(path).name == name:
                count["n"] += 1
                if count["n"] == nth:
                    yield HalfThenDie(f)
                    return
            yield f

    pipeline.io.atomic_open = dying
    import callbacks.atomic_io

    callbacks.atomic_io.atomic_open = dying


def main() -> None:
    fault, script, *args = sys.argv[1:]
    kind, *params = fault.split(":")
    if kind == "signal":
        signal_at_step(signal.Signals[params[0]], int(params[1]))
    elif kind == "kill-in-write":
        kill_in_write(params[0], int(params[1]))
    else:
        raise SystemExit(f"unknown fault {fault!r}")
    sys.argv = [str(REPO / script), *args]
    runpy.run_path(str(REPO / script), run_name="__main__")


if __name__ == "__main__":
    main()
