"""SIGINT / SIGTERM from an entry script's first line, before its heavy imports (the standard library only).

Importing torch, Lightning and transformers takes seconds (over 8 s on a loaded 2-core machine). Python's own
handlers would meet a signal then with a `KeyboardInterrupt` traceback (SIGINT) or a silent death (SIGTERM), so
each entry script (train.py, evaluate.py, experiments.py) calls `stop_early` in its first lines: until the job's own
handlers take over (callbacks/preemption.py `raise_on_signals`, installed where `pipeline.cli.main` and
`experiments.run` start), a signal ends the process at once with the one line and exit code a later one gives,
`stopped: interrupted by SIGINT; nothing was written`, 130 (SIGTERM: 143). Nothing has been written by then: the
config is composed, and every file written, after `raise_on_signals`. The process ends with `os._exit`, not by an
exception: a half-imported library has nothing to unwind, and no `except` of its own can swallow the signal.

`restore_signals` (callbacks/preemption.py) gives back Python's defaults where it would reinstate these handlers:
once the job has returned, its results are written and this handler's line would no longer be true.
"""

from __future__ import annotations

import os
import signal

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}  # 128 + signal number, as a shell reports a signalled job

_EARLY = {"state": "nothing was written", "pid": None, "before": {}}


def stopped_line(signum: int, state: str) -> str:
    """Return the line of a job stopped by `signum` outside training: `stopped: interrupted by SIGINT; <state>`."""
    return f"stopped: interrupted by {signal.Signals(signum).name}; {state}"


def _stop_now(signum, frame) -> None:
    if os.getpid() != _EARLY["pid"]:  # a process forked during the imports: Python's own behaviour
        handler = _EARLY["before"].get(signum, signal.SIG_DFL)
        if callable(handler):
            handler(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    os.write(2, (stopped_line(signum, _EARLY["state"]) + "\n").encode())
    os._exit(EXIT_CODES[signum])


def stop_early(state: str = "nothing was written") -> None:
    """Make SIGINT and SIGTERM end this process at once with `stopped: interrupted by SIG...; <state>` (130 / 143).

    For an entry script's first lines, before anything is imported or written; `raise_on_signals` replaces these
    handlers when the job starts. `state` says what the folder holds, as the job's later line would.
    """
    _EARLY.update(state=state, pid=os.getpid())
    for signum in EXIT_CODES:
        current = signal.getsignal(signum)
        if current is not _stop_now:  # called again (a script run twice in one process): keep the first one's
            _EARLY["before"][signum] = current
        signal.signal(signum, _stop_now)


def before_early(signum: int, handler):
    """Return `handler`, or Python's from before `stop_early` if `handler` is the early one (restore_signals)."""
    if handler is _stop_now:
        return _EARLY["before"].get(signum, signal.SIG_DFL)
    return handler
