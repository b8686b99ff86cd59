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

`stop_early` also stops, with one line, the other faults that would otherwise meet the imports:

- No writable temporary folder (a full disk, a file-size limit of 0): torchmetrics calls `tempfile.gettempdir()`
  while Lightning is imported, and its FileNotFoundError was a 40-line traceback. It is probed first:
  `error: cannot write a temporary file in any of [...] (<reason>); free space or set TMPDIR to a writable folder;
  nothing was written`, exit 1. Any other OSError raised by the imports is one line too (`import_fault`, exit 1).
  Where stderr itself cannot be written (a regular file under the same limit) only the exit code can say it.
- A grid's death: a grid starts each subprocess cell with `PARENT_VARIABLE` set to its pid (grid/engine.py
  `_launch`), and the cell asks the kernel for SIGTERM when that parent dies (Linux `prctl(PR_SET_PDEATHSIG)`;
  elsewhere a thread watches the parent pid), so a grid killed by SIGKILL does not leave its cell training on
  unseen: the cell stops through its SIGTERM path (a resumable last.ckpt, its `stopped:` line in its log).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}  # 128 + signal number, as a shell reports a signalled job
# SIGHUP (the terminal or ssh session closed) stops a job as SIGTERM does, unless the job was started ignoring it
# (`nohup`, tmux's and screen's own handling): an ignored SIGHUP stays ignored, read once at import (the first line)
if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
    EXIT_CODES[signal.SIGHUP] = 129
STOP_SIGNALS = tuple(EXIT_CODES)  # the signals every handler of the project stops a job on

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
    _say(stopped_line(signum, _EARLY["state"]))
    os._exit(EXIT_CODES[signum])


def stop_early(state: str = "nothing was written") -> None:
    """Make SIGINT and SIGTERM end this process at once with `stopped: interrupted by SIG...; <state>` (130 / 143).

    For an entry script's first lines, before anything is imported or written; `raise_on_signals` replaces these
    handlers when the job starts. `state` says what the folder holds, as the job's later line would. Also (module
    docstring): no writable temporary folder ends the process with one line, an OSError of the imports is one
    line, and a grid's subprocess cell gets SIGTERM when its grid dies.
    """
    _EARLY.update(state=state, pid=os.getpid())
    for signum in EXIT_CODES:
        current = signal.getsignal(signum)
        if current is not _stop_now:  # called again (a script run twice in one process): keep the first one's
            _EARLY["before"][signum] = current
        signal.signal(signum, _stop_now)
    if sys.excepthook is not import_fault:
        _EARLY["excepthook"] = sys.excepthook
        sys.excepthook = import_fault
    check_temp_dir()
    end_with_parent()


def _say(line: str) -> None:
    """Write `line` to stderr; a stderr that cannot be written (a file under a full disk) leaves the exit code."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass


def check_temp_dir() -> None:
    """Exit 1 with one line when no temporary folder can be written (`tempfile.gettempdir()` finds none).

    Lightning's import needs one (torchmetrics asks at import time): found here, before the imports, not as their
    traceback. Its answer is cached, so the imports ask no second time.
    """
    try:
        tempfile.gettempdir()
    except OSError as e:
        dirs = tempfile._candidate_tempdir_list()  # the folders gettempdir tried, in its order (TMPDIR first)
        _say(
            f"error: cannot write a temporary file in any of {dirs} ({_temp_reason(dirs) or e.strerror or e}); "
            "free space or set TMPDIR to a writable folder; nothing was written"
        )
        sys.exit(1)


def _temp_reason(dirs: list[str]) -> str:
    """Return the OS's reason for the first existing folder of `dirs` (gettempdir's error keeps none)."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = os.curdir
    for d in dirs:
        if d in (cwd, os.curdir) or not os.path.isdir(d):  # the working folder (a repository): not probed twice
            continue
        try:
            fd, name = tempfile.mkstemp(prefix=".isorank-probe-", dir=d)
        except OSError as e:
            return f"{d}: {e.strerror}"
        try:
            os.write(fd, b"probe")
        except OSError as e:
            return f"{d}: {e.strerror}"
        finally:
            os.close(fd)
            os.unlink(name)
    return ""


def import_fault(kind, value, tb) -> None:
    """sys.excepthook while the early handlers are in (the imports): an OSError is one line and exit 1.

    Later (the job's handlers in place, or Python's again) every error goes to the hook from before.
    """
    if issubclass(kind, OSError) and signal.getsignal(signal.SIGTERM) is _stop_now:
        _say(f"error: cannot start: {kind.__name__}: {value} (while importing the libraries); nothing was written")
        return  # Python then exits with code 1
    _EARLY.get("excepthook", sys.__excepthook__)(kind, value, tb)


PARENT_VARIABLE = "ISORANK_END_WITH_PARENT"  # a grid's pid, set for its subprocess cells (grid/engine.py _launch)
PARENT_POLL_S = 0.5  # how often the watch looks at the parent where the kernel cannot be asked (not Linux)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent() -> None:
    """Get SIGTERM when the process named by `PARENT_VARIABLE` (this one's parent, a grid) dies, however it dies.

    The variable is removed from the environment first: the ranks a cell starts under DDP have another parent.
    """
    value = os.environ.pop(PARENT_VARIABLE, "")
    if not value.isdigit():
        return
    parent = int(value)
    if not _parent_death_signal(signal.SIGTERM):
        threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()
    elif os.getppid() != parent:  # it died before the kernel was asked: no signal will come, so send it now
        os.kill(os.getpid(), signal.SIGTERM)


def _parent_death_signal(signum: int) -> bool:
    """Ask Linux to send `signum` to this process when its parent dies; False where that cannot be asked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    """Send this process SIGTERM once its parent is no longer `parent` (it died: this one was re-parented)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)


def before_early(signum: int, handler):
    """Return `handler`, or Python's from before `stop_early` if `handler` is the early one (restore_signals)."""
    if handler is _stop_now:
        return _EARLY["before"].get(signum, signal.SIG_DFL)
    return handler
