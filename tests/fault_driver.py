"""Runs train.py / evaluate.py with one injected fault, as a separate process (what a scheduler or the kernel would
do to a real job). The fault and the script come from the environment, so DDP ranks that Lightning launches as
`python tests/fault_driver.py <args>` run under the same fault:

    FAULT=signal:SIGTERM:5 SCRIPT=train.py python tests/fault_driver.py key=value ...   # signals itself after step 5
    FAULT=kill-in-write:last.ckpt:2 ...     # SIGKILL half-way through the 2nd write of last.ckpt
    FAULT=signal-in-validation:SIGTERM:8    # during the validation at step 8
    FAULT=raise:1:3 ...                     # global rank 1 raises after step 3 (DDP)

Test-only: the pipeline itself has no fault hooks; this wraps its Trainer and file writes from outside.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _at_step(step: int, act) -> None:
    """`act(trainer)` at the end of the training batch that reaches global step `step`."""
    from pytorch_lightning import Callback

    class Act(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == step:
                act(trainer)

    with_callback(Act())


def signal_in_validation(sig: signal.Signals, step: int) -> None:
    """The signal arrives after the first batch of the validation at global step `step`."""
    from pytorch_lightning import Callback

    class Send(Callback):
        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            if trainer.global_step == step and batch_idx == 0 and not trainer.sanity_checking:
                os.kill(os.getpid(), sig)

    with_callback(Send())


def with_callback(callback, patch=setattr) -> None:
    """Every Trainer a run builds gets `callback`: build_trainer is wrapped wherever a run looks it up (fine-tuning,
    the head stage, evaluation). `patch`: how the name is replaced (a test passes `monkeypatch.setattr`)."""
    import pipeline.head_stage
    import pipeline.run
    import pipeline.stages

    build = pipeline.stages.build_trainer

    def builder(*args, **kwargs):
        trainer = build(*args, **kwargs)
        trainer.callbacks.append(callback)
        return trainer

    for module in (pipeline.run, pipeline.head_stage, pipeline.stages):
        patch(module, "build_trainer", builder)


def signal_at_step(sig: signal.Signals, step: int) -> None:
    # handled between bytecodes, so before the next hook runs
    _at_step(step, lambda trainer: os.kill(os.getpid(), sig))


def raise_on_rank(rank: int, step: int) -> None:
    def fail(trainer):
        if trainer.global_rank == rank:
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")

    _at_step(step, fail)


def kill_in_write(name: str, nth: int) -> None:
    """The nth atomic write of a file called `name` dies (SIGKILL) after writing half of its bytes."""
    import core.io

    real = core.io.atomic_open
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

    core.io.atomic_open = dying
    import callbacks.atomic_io

    callbacks.atomic_io.atomic_open = dying


def main() -> None:
    fault, script = os.environ["FAULT"], os.environ["SCRIPT"]
    kind, *params = fault.split(":")
    if kind == "signal":
        signal_at_step(signal.Signals[params[0]], int(params[1]))
    elif kind == "signal-in-validation":
        signal_in_validation(signal.Signals[params[0]], int(params[1]))
    elif kind == "kill-in-write":
        kill_in_write(params[0], int(params[1]))
    elif kind == "raise":
        raise_on_rank(int(params[0]), int(params[1]))
    else:
        raise SystemExit(f"unknown fault {fault!r}")
    # not runpy.run_path: it sets sys.argv[0] to the script, and Lightning starts DDP ranks as `sys.argv`, which must
    # name this driver; sys.argv[1:] are the script's key=value args
    path = REPO / script
    exec(compile(path.read_text(), str(path), "exec"), {"__name__": "__main__", "__file__": str(path)})


if __name__ == "__main__":
    main()
