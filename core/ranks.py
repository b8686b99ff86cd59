"""A rank's death, seen by the others: a failed collective, or a watchdog on the processes a launcher started.

Lightning's launcher (and Fabric's) starts ranks 1..N-1 of a node as child processes of its local rank 0. When a rank
dies (SIGKILL, the OOM killer, a crash), the others learn it in one of two ways, whichever comes first:

- A collective with the dead rank fails at once: gloo's TCP pairs see the peer's sockets close (`Connection reset by
  peer`, `Connection closed by peer`, `Broken pipe`); a peer that hangs instead is met by the process group's timeout.
  `peer_failure` recognises these errors anywhere in an exception's chain.
- `RankWatch`, a daemon thread running while the ranks work together (Lightning's fit / validate / test, the split
  index encoding), polls the processes the launcher knows twice a second: on local rank 0 its children (their exit
  status: `killed by SIGKILL`, `exit code 1`), on a child its parent (local rank 0: the child is reparented when it
  dies). It interrupts the main thread with `RankDied`, so a rank working alone (encoding its share of a collection,
  which has no collective for minutes) stops within a second, and rank 0 is not killed silently by Lightning's own
  observer (which SIGKILLs every process 5 s after a child's non-zero exit; RankWatch takes its place).

Either way the job stops with one line, `stopped: rank 0 died (...); <what was kept>`, and exit code 1 (a fault of
the machine, as a refused write). The standard library only.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

EXIT_CODE = 1
POLL_S = 0.5  # how often RankWatch looks at the processes
ATTRIBUTE_S = 3.0  # after a failed collective: how long to wait for the dead process's exit to be seen (not a sleep)

# gloo's and the TCP store's words for a peer whose process is gone (or hangs, for the timeout)
_PEER_GONE = re.compile(
    r"(Connection reset by peer|Connection closed by peer|Broken pipe|Connection refused|"
    r"Socket Timeout|Timed out waiting|timed out after|Connection timed out)",
    re.IGNORECASE,
)
_SIGNAL = getattr(signal, "SIGUSR2", None)  # RankWatch's way into the main thread (pthread_kill)

# Set, and not 0, in every process of a distributed job but global rank 0 (Lightning's DDP children, torchrun,
# SLURM tasks, the first process of another node). Only global rank 0 takes the lock (core/lock.py): Lightning's DDP
# children re-run the entry script while their parent holds it; only it prints progress (core/progress.py).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def global_rank_zero() -> bool:
    """Tell whether this process is global rank 0 of its job, or not part of a distributed job: only it locks.

    That is, every variable of RANK_VARIABLES is unset, empty or 0.
    """
    return all(os.environ.get(v, "").strip() in ("", "0") for v in RANK_VARIABLES)


class RankDied(BaseException):
    """Another rank of this job died; `rank` (None: not known which), `how` (its status or the failed collective).

    `kept` says what the job's files hold (set by whoever knows: the checkpoint in training, the results folder
    otherwise). A BaseException, so that no `except Exception` swallows it on its way up.
    """

    code = EXIT_CODE

    def __init__(self, rank: int | None, how: str, kept: str = ""):
        self.rank, self.how, self.kept = rank, how, kept
        super().__init__(self.line())

    def line(self) -> str:
        """`rank 0 died (killed by SIGKILL); <kept>`: the message after `stopped: `."""
        who = f"rank {self.rank}" if self.rank is not None else "another rank"
        return f"{who} died ({self.how})" + (f"; {self.kept}" if self.kept else "")

    def __str__(self) -> str:
        return self.line()

    def keeping(self, kept: str) -> RankDied:
        """Return this death with `kept` said (a new exception: the same rank and cause)."""
        return RankDied(self.rank, self.how, kept)


class RankStopped(RankDied):
    """Another rank of this job was stopped by a signal sent to it alone (SIGINT / SIGTERM); `signum`.

    Its exit code is the signal's (128 + signum), as if this job had been stopped itself; the line names the rank.
    """

    def __init__(self, rank: int | None, signum: int, kept: str = ""):
        self.signum, self.code = signum, 128 + signum
        super().__init__(rank, signal.Signals(signum).name, kept)

    def line(self) -> str:
        """`rank 1 was stopped by SIGTERM; <kept>`: the message after `stopped: `."""
        who = f"rank {self.rank}" if self.rank is not None else "another rank"
        return f"{who} was stopped by {self.how}" + (f"; {self.kept}" if self.kept else "")

    def keeping(self, kept: str) -> RankStopped:
        """Return this stop with `kept` said."""
        return RankStopped(self.rank, self.signum, kept)


def peer_failure(e: BaseException) -> str | None:
    """Return the reason a collective gave for a peer that is gone (`Connection reset by peer`, ...), else None.

    Looks through `e`'s chain (cause and context): a RuntimeError of gloo or the TCP store, or torch's
    DistBackendError / DistNetworkError, whose message names a closed, reset or timed-out connection.
    """
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, RuntimeError):
            found = _PEER_GONE.search(str(e))
            if found:
                return found.group(1)
        e = e.__cause__ or e.__context__
    return None


def exit_status(returncode: int) -> str:
    """Say how a subprocess ended: `killed by SIGKILL` for returncode -9, `exit code 1` for 1."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class RankWatch:
    """Watch the launcher's processes of this node while the ranks work together; see the module docstring.

    `rank`: this process' global rank; `local_rank`; `children`: the subprocess.Popen objects of local ranks
    1..N-1 when this process started them (local rank 0 under Lightning's or Fabric's launcher); `parent`: this
    process' parent pid when the parent is local rank 0 (a child of that launcher), else None. `world`: the world
    size (2: the only peer is the other rank, also when a collective fails before the watchdog sees the death).
    """

    def __init__(self, rank: int, local_rank: int, world: int, children: list | None = None, parent: int | None = None):
        self.rank, self.local_rank, self.world = rank, local_rank, world
        self.children = list(children or [])
        self.parent = parent
        self.dead: RankDied | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main = threading.main_thread().ident
        self._armed, self._old = False, None

    # ---- who died ------------------------------------------------------------------------------------------------
    def check(self) -> RankDied | None:
        """Return the death seen now, if any: a child that ended (its status), or the parent gone."""
        for i, proc in enumerate(self.children):
            code = proc.poll()
            if code is not None and code != 0:
                return RankDied(self.rank + i + 1, exit_status(code))
        if self.parent is not None and os.getppid() != self.parent:
            return RankDied(self.rank - self.local_rank, "its process ended")
        return None

    def attribute(self, reason: str) -> RankDied:
        """Return the death behind a failed collective (`reason`: peer_failure's words), waiting up to ATTRIBUTE_S.

        A dead peer's sockets close a moment before its exit can be seen; the wait ends as soon as it is.
        """
        end = time.monotonic() + (ATTRIBUTE_S if self.children or self.parent is not None else 0)
        while True:
            seen = self.dead or self.check()
            if seen is not None:
                return RankDied(seen.rank, f"{seen.how}; {reason}")
            if time.monotonic() >= end:
                break
            self._stop.wait(0.05)
        return RankDied(1 - self.rank if self.world == 2 else None, reason)

    # ---- the watchdog ------------------------------------------------------------------------------------------
    def start(self) -> RankWatch:
        """Start watching (a daemon thread); the main thread gets RankDied when a watched process dies."""
        if (not self.children and self.parent is None) or self._thread is not None:
            return self
        if threading.current_thread() is threading.main_thread() and _SIGNAL is not None:
            self._old, self._armed = signal.signal(_SIGNAL, self._raise), True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rank-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (the ranks' work together is over: one ending first is no death) and restore the handler."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        if self._armed and threading.current_thread() is threading.main_thread():
            signal.signal(_SIGNAL, self._old if self._old is not None else signal.SIG_DFL)
            self._armed, self._old = False, None

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.dead = self.dead or self.check()
            if self.dead is not None and self._armed and not self._stop.is_set():
                signal.pthread_kill(self._main, _SIGNAL)  # again each POLL_S until raised (see _raise)

    def _raise(self, signum, frame) -> None:
        if self.dead is None or self._stop.is_set():
            return
        if sys.exc_info()[1] is not None:  # the main thread is handling an error: raise once it has, not inside
            return
        self._stop.set()  # raised once
        raise self.dead


PARENT_AT_START = os.getppid()  # read at import, early in an entry script: a child rank's launcher (local rank 0)
_CURRENT: list[RankWatch] = []


def current() -> RankWatch | None:
    """Return the RankWatch of this process' latest work together (None before one)."""
    return _CURRENT[-1] if _CURRENT else None


def watching(watch: RankWatch) -> RankWatch:
    """Start `watch` and make it current (`current`), until `unwatch`; Lightning's child-process observer is stopped.

    The observer (lightning_fabric's launcher, local rank 0) SIGKILLs every process of the node 5 s after a child's
    non-zero exit, which would end this one without its line; RankWatch sees the same deaths within POLL_S.
    """
    _CURRENT[:] = [watch.start()]
    if watch.children:
        for thread in threading.enumerate():
            if thread.name == "child-process-observer" and hasattr(thread, "_run"):
                thread._run = lambda: True  # its next look ends it
    return watch


def unwatch(watch: RankWatch) -> None:
    """Stop `watch`; it stays current for attributing a failure until the next `watching`."""
    watch.stop()


def stop_watching(wait_s: float = 0.0) -> None:
    """Stop the current RankWatch, if any (the job is ending: on its own error, or done).

    `wait_s`: how long to wait for the ranks this process started to end too (they were stopped with it, or see it
    gone), so that none prints after the command has returned.
    """
    watch = current()
    if watch is not None:
        watch.stop()
        end = time.monotonic() + wait_s
        for proc in watch.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, end - time.monotonic()))


def as_rank_death(e: BaseException) -> RankDied | None:
    """Return `e` as a RankDied: itself, or a failed collective's (peer_failure) with the rank that died; else None.

    A failed collective needs peers: a RankWatch of this process, or WORLD_SIZE > 1 (launchers set it); a single
    process' `Connection refused` (a hub, a logger) is no rank's death.

    A RankDied of the watchdog raised while a failed collective unwinds also gets the collective's reason.
    """
    if isinstance(e, RankDied):
        reason = peer_failure(e.__context__) if e.__context__ is not None else None
        return RankDied(e.rank, f"{e.how}; {reason}", e.kept) if reason and reason not in e.how else e
    watch = current()
    if watch is None and int(os.environ.get("WORLD_SIZE", "1") or 1) < 2:  # one process: no peer to lose
        return None
    reason = peer_failure(e)
    if reason is None:
        return None
    if watch is None:
        return RankDied(None, reason)
    return watch.attribute(reason)
