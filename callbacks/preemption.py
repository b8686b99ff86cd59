"""Pre-emption: on SIGTERM or SIGINT during training, write a resumable `last.ckpt` and stop.

SIGTERM (what a cluster scheduler sends before it kills a job) or SIGINT (Ctrl-C) during training writes a resumable
`last.ckpt` and stops; `ckpt_path=<that file>` then continues to the same final weights as a run that was never
interrupted.

The signal only sets a flag. Lightning's own SIGTERM handler does that and its training loop raises
`SIGTERMException` at the end of the current batch, after that batch's validation (if one was due) and after the
batch counts as completed: the one point inside an epoch where weights, optimiser, schedule, loop counters and the
sampler position agree. This callback routes SIGINT to the same flag (a second Ctrl-C still interrupts at once),
holds a signal that arrives during a validation until that validation ends (Lightning would abort it, and with it
the choice of the best checkpoint), and writes `last.ckpt` in `on_exception`, atomically (callbacks/atomic_io.py),
so a kill during that write leaves the previous `last.ckpt` in place.

Outside training (data and model loading, every evaluation, the head stage's cache and fit, export, retrieval,
analyses, experiments.py), `raise_on_signals` makes SIGINT and SIGTERM raise `Signalled` where the process is: the
job unwinds (temp files and staged result sets removed, locks released) and the entry script prints one line and
exits 130 / 143. Lightning passes it through (it is no KeyboardInterrupt, which Lightning turns into exit 1).
"""

from __future__ import annotations

import inspect
import os
import signal
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from pytorch_lightning import Callback
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities.exceptions import SIGTERMException
from torch import Tensor

from callbacks.rank_watch import kept_checkpoint
from core.host_reads import DeferredReads
from core.ranks import RankDied, as_rank_death
from core.signals import EXIT_CODES, STOP_SIGNALS, before_early


class Interrupted(SystemExit):
    """Training stopped on a signal; `checkpoint` is the resumable file written on the way out (None if none)."""

    def __init__(self, signum: int, step: int, checkpoint: str | None):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(EXIT_CODES.get(signum, 1))

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name
        if self.checkpoint is None:
            return f"interrupted by {name} at step {self.step}; no resumable checkpoint was written"
        return f"interrupted by {name} at step {self.step}; resume with ckpt_path={self.checkpoint}"


class Signalled(BaseException):
    """Signal that SIGINT / SIGTERM arrived outside a training loop (raise_on_signals).

    A BaseException, so that no `except Exception` swallows it.
    """

    def __init__(self, signum: int):
        self.signum = signum
        self.code = EXIT_CODES.get(signum, 1)
        super().__init__(signal.Signals(signum).name)


_OWNER = {"pid": None, "raised": False, "signum": None}


def _raise(signum, frame) -> None:
    if os.getpid() != _OWNER["pid"]:  # a forked DataLoader worker: it stops quietly on KeyboardInterrupt
        raise KeyboardInterrupt
    _OWNER["signum"] = _OWNER["signum"] or signum
    if _OWNER["raised"]:  # a second signal while the first unwinds: the job is already stopping
        return
    _OWNER["raised"] = True
    raise Signalled(signum)


def received_signal() -> int | None:
    """Return the SIGINT / SIGTERM this process received since `raise_on_signals`, else None.

    A Ctrl-C reaches every rank of a terminal's process group: a rank that was interrupted itself reports its stop,
    not the death of a peer that the same Ctrl-C stopped first.
    """
    return _OWNER["signum"]


def raise_on_signals() -> dict:
    """Make SIGINT and SIGTERM raise Signalled in this process from now on; return the handlers they replace.

    Lightning's signal connector keeps these handlers beside its own during fit, validate and test, and restores them
    after. The returned handlers are for restore_signals (an entry point called inside another program, e.g. a test,
    gives them back). Outside the main thread nothing is changed and {} is returned.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    _OWNER.update(pid=os.getpid(), raised=False, signum=None)
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s in STOP_SIGNALS:
        signal.signal(s, _raise)
    return old


def no_broadcast_in_sigterm(trainer) -> None:
    """Make Lightning's SIGTERM handler on `trainer` pass the signal on without its broadcast (all stages).

    Lightning (2.6) broadcasts from inside its SIGTERM handler, a collective at whatever point the signal lands: under
    DDP another rank is then inside a different collective (a test's gather, a barrier) and both wait for good. Without
    it, every rank the signal reaches (rank 0 passes it on to the ranks it started, as Lightning's does) raises
    `Signalled` where it is, and a rank left in a collective with a stopped one sees it die (core/ranks.py). In
    training `Preemption` replaces the handler altogether and stops every rank at one batch.
    """
    connector = trainer._signal_connector
    if not callable(getattr(connector, "_sigterm_notifier_fn", None)):  # a Lightning that moved it
        raise RuntimeError(
            "pytorch-lightning's signal connector has no _sigterm_notifier_fn: callbacks/preemption.py cannot keep a "
            "SIGTERM from hanging DDP ranks with this version"
        )

    def notify(signum, frame) -> None:
        if not connector.received_sigterm:
            launcher = trainer.strategy.launcher
            if launcher is not None:
                launcher.kill(signum)
        connector.received_sigterm = True

    connector._sigterm_notifier_fn = notify  # looked up when Lightning registers its handlers, at each stage's start


def restore_signals(old: dict) -> None:
    """Reinstate the signal handlers that `raise_on_signals` returned.

    A None entry (a handler not installed from Python, which cannot be reinstated) is skipped. An entry script's early
    handler (core/signals.py) is not reinstated: its line ("nothing was written") no longer holds once the job has
    run, so Python's default comes back in its place.
    """
    for signum, handler in old.items():
        handler = before_early(signum, handler)
        if handler is not None:
            signal.signal(signum, handler)


class Preemption(Callback):
    """Stop training cleanly on SIGTERM or SIGINT, after the current batch, with a resumable `last.ckpt`.

    Routes SIGINT to Lightning's SIGTERM flag (a second Ctrl-C raises `Signalled` at once), holds a signal that
    arrives during a validation until it ends, and writes `last.ckpt` through the checkpoint callback's `write_last`
    when Lightning raises SIGTERMException. After the run, `signum`, `step` and `checkpoint` say what stopped it,
    where, and the file to resume from (see `interruptible`).
    """

    def __init__(self):
        self.signum: int | None = None
        self.checkpoint: str | None = None
        self.step = 0
        self._pending: int | None = None  # a signal held back until the validation in progress ends
        self._requested = 0  # DDP: the signal this rank was sent; the ranks agree at the next batch start
        self._agreed = DeferredReads()  # DDP: the all-reduced marks, read a batch later on CUDA

    def on_train_start(self, trainer, pl_module) -> None:
        """Install this callback's SIGTERM and SIGINT handlers in place of Lightning's (main thread only)."""
        # after Lightning's signal connector registered its handlers; it restores the originals at teardown
        self._trainer, self._pending, self._requested, self._agreed = trainer, None, 0, DeferredReads()
        if trainer.world_size > 1:
            # Lightning (2.6) broadcasts rank 0's flag inside its SIGTERM handler, a collective at whatever point the
            # signal lands (another rank inside a training step's all_gather: both hang for good), and each rank
            # also stops on its own flag at the end of a batch, unsynchronised. Here a signal only marks its rank,
            # and Lightning's per-batch broadcast is replaced by one all-reduce of the marks: every rank stops at
            # the same batch start, whichever rank was signalled (a Ctrl-C reaches all, a scheduler's kill maybe one).
            loop = trainer.fit_loop.epoch_loop
            if not callable(getattr(loop, "_broadcast_sigterm_tensor", None)):  # a Lightning that moved it
                raise RuntimeError(
                    "pytorch-lightning's training loop has no _broadcast_sigterm_tensor: callbacks/preemption.py "
                    "cannot make a signal stop every DDP rank at one batch with this version"
                )
            loop._broadcast_sigterm_tensor = self._agree_to_stop
        if threading.current_thread() is threading.main_thread():
            # Lightning's notifier alone (sets the flag, passes the signal on to DDP ranks it started): the handler
            # it composes also calls the one it found, raise_on_signals', which would stop mid-batch
            self._lightning_sigterm = getattr(
                trainer._signal_connector, "_sigterm_notifier_fn", None
            ) or signal.getsignal(signal.SIGTERM)
            for s in STOP_SIGNALS:  # SIGHUP too, where the job does not ignore it (core/signals.py)
                signal.signal(s, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum is not None:
            raise Signalled(signum)  # a second Ctrl-C: stop now, without a checkpoint
        if (
            self.signum is None and signum == signal.SIGINT and self._trainer.global_rank == 0
        ):  # one line, not one a rank
            # attributed to this file, not to the frame the signal interrupted (often torch's or transformers'):
            # the entry scripts print a warning as `warning: ...` only when it comes from the project's code
            warnings.warn_explicit(
                "SIGINT: stopping after this batch with a resumable checkpoint (Ctrl-C again to stop at once)",
                UserWarning,
                __file__,
                inspect.currentframe().f_lineno,
            )
        self.signum = self.signum or signum
        if self._trainer.validating:
            # Lightning would abort the validation in progress; it decides the best checkpoint, so let it finish
            self._pending = signum
        else:
            self._stop(signum, frame)

    def _stop(self, signum, frame) -> None:
        if self._trainer.world_size > 1:
            self._requested = signum  # no collective in a signal handler: _agree_to_stop reads it at the batch start
        elif signum == signal.SIGTERM and callable(self._lightning_sigterm):
            self._lightning_sigterm(signum, frame)  # sets the flag, and passes the signal on to DDP ranks it started
        else:
            self._trainer._signal_connector.received_sigterm = True

    def _agree_to_stop(self) -> None:
        """DDP, at every training batch start (in place of Lightning's broadcast): stop every rank if any asked to.

        The ranks' marks are all-reduced on the device; on CUDA the result is read one batch later (a pinned copy,
        core/host_reads.py), so that the host never waits for the step in flight: every rank reads the same batch's
        result at the same batch start, and stops there, one batch after the signal (on the CPU, where a read costs
        nothing, at once). A failed all-reduce (a rank died) propagates, for `interruptible` to name the death.
        """
        flag = self._marks()
        self._agreed.push(self._trainer.global_step, flag)
        for _, (signum,) in self._agreed.pop(keep_last=1 if flag.device.type == "cuda" else 0):
            if signum:
                self._stop_all(int(signum))

    def _marks(self) -> Tensor:
        """Return the largest signal any rank was sent ([1], on the device; 0: none), by one all-reduce."""
        # filled on the device: a tensor built from a Python value would be a blocking host-to-device copy
        flag = torch.full((1,), self._requested, device=self._trainer.strategy.root_device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return flag

    def _stop_all(self, signum: int) -> None:
        self.signum = self.signum or signum  # a rank that was not signalled names the signal another rank got
        self._trainer._signal_connector.received_sigterm = True
        raise SIGTERMException()

    def on_train_end(self, trainer, pl_module) -> None:
        """DDP: a signal in the last batches, which no batch start agreed on, still stops every rank, with last.ckpt.

        Without this the job would go on to its test as if no signal had come.
        """
        # a rank's mark is never cleared, so this all-reduce sees every signal the pending ones would
        if trainer.world_size > 1 and self._trainer is trainer and (signum := int(self._marks().item())):
            self._stop_all(signum)

    def on_validation_end(self, trainer, pl_module) -> None:
        """Pass on a signal held back during the validation, so training stops after this batch."""
        if self._pending is not None:
            signum, self._pending = self._pending, None
            self._stop(signum, None)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Write the resumable `last.ckpt` when fitting stops on SIGTERMException; record the signal and step."""
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        self.signum = self.signum or signal.SIGTERM
        self.step = trainer.global_step
        ckpt = trainer.checkpoint_callback
        if ckpt is not None and hasattr(ckpt, "write_last"):
            self.checkpoint = ckpt.write_last(trainer)


@contextmanager
def interruptible(trainer):
    """Turn Lightning's SIGTERMException (fit, validation or test) and `Signalled` into `Interrupted`.

    `Interrupted` names the checkpoint to resume from: the one written on the way out, else the run's latest
    `last.ckpt`. Another rank's death (`core.ranks.RankDied`, or a collective failed by it) becomes a RankDied that
    names the `last.ckpt` kept.
    """
    try:
        yield
    except RankDied as e:  # another rank's death, seen by the watchdog (core/ranks.py): what this run keeps
        raise as_rank_death(e).keeping(kept_checkpoint(trainer)) from None
    except RuntimeError as e:  # a collective that failed because another rank died
        dead = as_rank_death(e)
        if dead is None:
            raise
        raise dead.keeping(kept_checkpoint(trainer)) from None
    except Signalled as e:  # outside the training loop (a test before or after it, a second Ctrl-C)
        last = getattr(trainer.checkpoint_callback, "last_model_path", "")
        raise Interrupted(e.signum, trainer.global_step, last if last and Path(last).is_file() else None) from None
    except SIGTERMException as e:
        cb = next((c for c in trainer.callbacks if isinstance(c, Preemption)), None)
        ckpt = cb.checkpoint if cb is not None else None
        last = getattr(trainer.checkpoint_callback, "last_model_path", "")
        if ckpt is None and last and Path(last).is_file():
            ckpt = last
        raise Interrupted((cb.signum if cb is not None else None) or signal.SIGTERM, trainer.global_step, ckpt) from e
