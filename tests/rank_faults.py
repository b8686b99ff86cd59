"""Runs train.py / evaluate.py as DDP ranks one of which dies by SIGKILL (tests/test_faults_signals.py):

    RANK_FAULT=train:0:3 SCRIPT=train.py python tests/rank_faults.py key=value ...   # rank 0 at the end of step 3
    RANK_FAULT=encode:1:2 SCRIPT=evaluate.py ...   # rank 1 at its 2nd batch of the split index encoding
    RANK_FAULT=sigterm:1:3 SCRIPT=train.py ...     # rank 1 sends itself SIGTERM at the end of step 3 (it lives on)
    RANK_FAULT=testterm:0:1 SCRIPT=evaluate.py ... # rank 0 sends itself SIGTERM at the end of its 1st test batch
    RANK_FAULT=encodeterm:1:2 SCRIPT=evaluate.py ...  # rank 1 sends itself SIGTERM at its 2nd encoding batch
    RANK_FAULT=encodeint:1:2 SCRIPT=evaluate.py ...   # rank 1 sends SIGINT to the whole job there (a Ctrl-C)

Every rank runs this driver (Lightning and Fabric start ranks 1..N-1 as `sys.argv` again). Each writes, into the
folder RANK_FAULT_DIR, `killed` (the time it SIGKILLs itself) or `exit-<rank>` (its exit code, when it leaves
by sys.exit). Test-only: the pipeline has no fault hooks; this wraps it from outside.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fault_driver import with_callback  # noqa: E402 - after the repo is on sys.path

MARKS = Path(os.environ["RANK_FAULT_DIR"])


def _die(sig: int = signal.SIGKILL, group: bool = False) -> None:
    (MARKS / "killed").write_text(str(time.time()))
    if group:  # every process of the job, as a terminal's Ctrl-C
        os.killpg(os.getpgrp(), sig)
    else:
        os.kill(os.getpid(), sig)


def at_train_step(rank: int, step: int, sig: int = signal.SIGKILL) -> None:
    from pytorch_lightning import Callback

    class Die(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == step and trainer.global_rank == rank:
                _die(sig)

    with_callback(Die())


def at_test_batch(rank: int, nth: int, sig: int = signal.SIGTERM) -> None:
    from pytorch_lightning import Callback

    class Signal(Callback):
        seen = 0

        def on_test_batch_end(self, trainer, *args, **kwargs):
            if trainer.global_rank == rank:
                self.seen += 1
                if self.seen == nth:
                    _die(sig)

    with_callback(Signal())


def at_encode_batch(rank: int, nth: int, sig: int = signal.SIGKILL, group: bool = False) -> None:
    import retrieval.split

    real = retrieval.split.ShareWriter.add
    count = {"n": 0}

    def add(self, *a, **k):
        if retrieval.split.ranks()[0] == rank:
            count["n"] += 1
            if count["n"] == nth:
                _die(sig, group)
        return real(self, *a, **k)

    retrieval.split.ShareWriter.add = add


def main() -> None:
    kind, rank, when = os.environ["RANK_FAULT"].split(":")
    faults = {
        "train": at_train_step,
        "encode": at_encode_batch,
        "sigterm": lambda r, w: at_train_step(r, w, signal.SIGTERM),
        "testterm": at_test_batch,
        "encodeterm": lambda r, w: at_encode_batch(r, w, signal.SIGTERM),
        "encodeint": lambda r, w: at_encode_batch(r, w, signal.SIGINT, group=True),
    }
    faults[kind](int(rank), int(when))
    me = os.environ.get("LOCAL_RANK", "0")
    path = REPO / os.environ["SCRIPT"]
    try:
        exec(compile(path.read_text(), str(path), "exec"), {"__name__": "__main__", "__file__": str(path)})
    except SystemExit as e:
        (MARKS / f"exit-{me}").write_text(str(e.code))
        raise


if __name__ == "__main__":
    main()
