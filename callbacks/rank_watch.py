"""Any rank's death ends the others with one line (core/ranks.py): the watchdog while Lightning's ranks work together.

`RankWatchCallback` starts a `core.ranks.RankWatch` when a fit, validation or test sets up under DDP and stops it at
teardown (or on an exception): local rank 0 watches the child processes Lightning's launcher started, a child its
parent. `watch_for` builds it from a Lightning or Fabric strategy (retrieval/retrieve.py's split encoding uses it).
"""

from __future__ import annotations

from pathlib import Path

from lightning_fabric.plugins.environments import LightningEnvironment
from pytorch_lightning import Callback

from core.ranks import PARENT_AT_START, RankWatch, unwatch, watching


def watch_for(strategy) -> RankWatch | None:
    """Return the RankWatch of this process under `strategy` (Lightning's or Fabric's); None with one process."""
    world = int(getattr(strategy, "world_size", 1) or 1)
    if world < 2:
        return None
    launcher = getattr(strategy, "launcher", None)
    env = getattr(strategy, "cluster_environment", None)
    local = int(strategy.local_rank)
    # a child of Lightning's (or Fabric's) launcher, not of torchrun's or SLURM's agent: its parent is local rank 0
    parent = PARENT_AT_START if local > 0 and isinstance(env, LightningEnvironment) else None
    children = list(getattr(launcher, "procs", None) or []) if local == 0 else []
    return RankWatch(int(strategy.global_rank), local, world, children=children, parent=parent)


def kept_checkpoint(trainer) -> str:
    """Say what a stopped training run keeps: `last.ckpt at step N is kept: resume with ckpt_path=...`, or none.

    The step is the one the checkpoint callback finished writing (on every rank: saving ends with a barrier), so a
    rank killed while writing leaves the earlier file named, which atomic writes keep whole.
    """
    cb = trainer.checkpoint_callback
    last = getattr(cb, "last_model_path", "") or ""
    step = getattr(cb, "_last_step_written", -1)
    if last and step is not None and step >= 0:
        return f"last.ckpt at step {step} is kept: resume with ckpt_path={last}"
    if last and Path(last).is_file():
        return f"'{last}' is kept: resume with ckpt_path={last}"
    return "no resumable checkpoint (last.ckpt) was written by this run"


class RankWatchCallback(Callback):
    """Run a RankWatch from setup to teardown of every fit, validation and test under DDP (see the module docstring)."""

    def __init__(self):
        self.watch: RankWatch | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Start watching the other ranks' processes (after Lightning launched them and joined the process group)."""
        self.watch = watch_for(trainer.strategy)
        if self.watch is not None:
            watching(self.watch)

    def _stop(self) -> None:
        if self.watch is not None:
            unwatch(self.watch)
            self.watch = None

    def teardown(self, trainer, pl_module, stage: str) -> None:
        """Stop watching: the ranks' work together is over, so one ending first is no death."""
        self._stop()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Stop watching: the job is stopping (its line names a death already seen, if any)."""
        self._stop()
