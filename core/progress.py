"""Progress of the long phases of every job: a Rich bar on a terminal, one line per phase in a log.

    with phase(f"building the document store ({n:,} passages)", total=n, unit="passages") as p:
        for batch in batches:
            ...
            p.advance(len(batch))

A phase is a piece of work that can run for minutes at MS MARCO scale (a store, index or token cache built, triples
parsed, a collection encoded, BM25 search, the isotropy protocol, an analysis, a grid cell) outside Lightning's loops,
which have their own bar (callbacks/progress.py). What it prints, on global rank 0 only:

- stdout a terminal: a Rich progress bar (transient, on the console Lightning's bar uses, so the two stack), shown
  once the phase has run `QUIET_S`; when it ends, its done line (below) stays in the scrollback.
- otherwise (a log file, CI, a test): on stderr, after `EVERY_S` and every `EVERY_S` after that, a line saying how
  far it is, and when it ends, one line with its time. Two shapes, the same for every phase:

      <name> ... <s> s so far[, <stage>][, <done>[/<total>] <unit> (<rate>/s)]
      <name> ... done in <s.s> s

  e.g. `building the document store (1,000,000 passages) ... done in 83.2 s`.
- a phase shorter than `QUIET_S` prints nothing, so small runs stay quiet; a phase that raises prints no done line
  (the error says what happened).

`QUIET_S` (2 s) and `EVERY_S` (30 s) are read from the environment when a phase starts: `ISORANK_PROGRESS_QUIET_S`
(0: every phase prints its line) and `ISORANK_PROGRESS_EVERY_S`. A background thread, running only while a phase
does, draws the bars and writes the lines, so a phase whose work is one long call (a sort) is not silent either;
`advance` is an integer addition, cheap enough for every batch. `times()` holds the phases that printed, for the
W&B run summary (callbacks/loggers.py). The standard library and (on a terminal) rich only.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from core.errors import InputError
from core.ranks import global_rank_zero

QUIET_S = 2.0  # a phase shorter than this prints nothing; on a terminal its bar appears only after this
EVERY_S = 30.0  # a progress line of a running phase this often, when not on a terminal
QUIET_ENV, EVERY_ENV = "ISORANK_PROGRESS_QUIET_S", "ISORANK_PROGRESS_EVERY_S"
TICK_S = 0.25  # how often the background thread looks at the running phases
IDLE_S = 2.0  # the thread ends after this long without a phase (a build checking many small files starts one)

__all__ = ["phase", "Phase", "times", "on_terminal", "QUIET_S", "EVERY_S", "QUIET_ENV", "EVERY_ENV"]


def _seconds(env: str, default: float) -> float:
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise InputError(f"environment variable {env}", f"is '{raw}'; expected a number of seconds >= 0")
    return value


def _rank_zero() -> bool:
    """Whether this process is global rank 0 (or alone): the launchers' variables, then an initialised process group.

    torch is looked up, not imported: a process that never imported it has no process group.
    """
    if not global_rank_zero():
        return False
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return True


def on_terminal() -> bool:
    """Whether stdout is a terminal, as Rich (and so Lightning's bar) decides it."""
    try:
        from rich import get_console
    except ImportError:  # rich is a dependency; without it, lines
        return False
    return get_console().is_terminal


class Phase:
    """One running phase (see the module docstring).

    `advance(n)` counts work done; `stage(label, total)` starts a named part with its own count (a two-pass build).
    """

    def __init__(self, name: str, total: int | None, unit: str, key: str, quiet_s: float, every_s: float, shown: bool):
        self.name, self.total, self.unit, self.key = name, total, unit, key
        self.quiet_s, self.every_s, self.shown = quiet_s, every_s, shown
        self.start = self.stage_start = time.monotonic()
        self.done = 0
        self.label: str | None = None
        self.next_line = self.start + every_s
        self.task = None  # its Rich task, once its bar is shown
        self.terminal = False
        self.says_done = True

    def advance(self, n: int = 1) -> None:
        """Count `n` more items done."""
        self.done += n

    def stage(self, label: str, total: int | None = None) -> None:
        """Start the part `label` of the phase: its count starts from 0 (of `total`)."""
        self.label, self.total, self.done, self.stage_start = label, total, 0, time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the phase started."""
        return time.monotonic() - self.start

    def progress_line(self) -> str:
        """`<name> ... <s> s so far[, <stage>][, <done>[/<total>] <unit> (<rate>/s)]`."""
        now = time.monotonic()
        parts = [f"{self.name} ... {now - self.start:.0f} s so far"]
        if self.label:
            parts.append(self.label)
        if self.done or self.total:
            count = f"{self.done:,}" + (f"/{self.total:,}" if self.total is not None else "")
            rate = self.done / max(now - self.stage_start, 1e-9)
            shown = f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"
            parts.append(f"{count}{' ' + self.unit if self.unit else ''} ({shown}/s)")
        return ", ".join(parts)

    def done_line(self, seconds: float) -> str:
        """`<name> ... done in <s.s> s`."""
        return f"{self.name} ... done in {seconds:.1f} s"

    def description(self) -> str:
        """Return the bar's text: the name, and the stage when there is one."""
        return self.name + (f": {self.label}" if self.label else "")


class _Reporter:
    """The running phases of this process, and the thread that draws their bars or writes their progress lines."""

    def __init__(self):
        self.lock = threading.RLock()
        self.phases: list[Phase] = []
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()
        self.progress = None  # the Rich Progress while a bar is shown
        self.times: dict[str, float] = {}

    def add(self, p: Phase) -> None:
        with self.lock:
            if self.pid != os.getpid():  # a forked child: its parent's thread and bars are not its own
                self.__init__()
            self.phases.append(p)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="progress", daemon=True)
                self.thread.start()

    def end(self, p: Phase, ok: bool) -> None:
        seconds = p.elapsed()
        with self.lock:
            if p in self.phases:
                self.phases.remove(p)
            self._hide(p)
            if ok and seconds >= p.quiet_s:
                self.times[p.key] = self.times.get(p.key, 0.0) + seconds
                if p.says_done:
                    self._say(p, p.done_line(seconds))

    def _run(self) -> None:
        idle = 0.0
        while True:
            time.sleep(TICK_S)
            with self.lock:
                idle = idle + TICK_S if not self.phases else 0.0
                if idle >= IDLE_S:
                    self.thread = None
                    return
                for p in list(self.phases):
                    self._tick(p)
                if self.progress is not None:
                    self.progress.refresh()

    def _tick(self, p: Phase) -> None:
        now = time.monotonic()
        if p.terminal:
            if p.task is None and now - p.start >= p.quiet_s and self._show(p):
                return
            if p.task is not None:
                self.progress.update(p.task, description=p.description(), completed=p.done, total=p.total)
                return
        if now >= p.next_line:  # no terminal (or no bar could be shown): a line every EVERY_S
            p.next_line = now + p.every_s
            self._say(p, p.progress_line())

    def _show(self, p: Phase) -> bool:
        """Show `p`'s bar (starting the Rich display for the first); False when Rich cannot (lines instead)."""
        try:
            if self.progress is None:
                from rich import get_console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

                progress = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=get_console(),
                    transient=True,
                    auto_refresh=False,  # refreshed by this thread
                )
                progress.start()  # nested below Lightning's bar when that one is live (rich >= 14)
                self.progress = progress
            p.task = self.progress.add_task(p.description(), total=p.total, completed=p.done)
            return True
        except Exception:  # noqa: BLE001 - an older rich refusing a second live display: lines instead
            p.terminal = False
            return False

    def _hide(self, p: Phase) -> None:
        if p.task is not None and self.progress is not None:
            self.progress.remove_task(p.task)
            p.task = None
            if not self.progress.task_ids:
                self.progress.stop()
                self.progress = None

    def _say(self, p: Phase, line: str) -> None:
        if p.terminal:
            from rich import get_console

            get_console().print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=sys.stderr, flush=True)


_REPORTER = _Reporter()


@contextmanager
def phase(
    name: str, total: int | None = None, unit: str = "", key: str | None = None, done_line: bool = True
) -> Iterator[Phase]:
    """Run the block as the phase `name` (module docstring); yield its `Phase` to count the work done.

    `name` says what is done, with its size: `building the BM25 index (1,000,000 passages)`. `total`, `unit`: what
    `advance` counts. `key`: its name in `times()` (default: `name` without its parenthesis, so runs of other sizes
    add up). `done_line=False`: the caller prints its own line when the phase ends (a grid cell's `ran in`).
    """
    p = Phase(
        name,
        total,
        unit,
        key or name.split(" (", 1)[0],
        _seconds(QUIET_ENV, QUIET_S),
        _seconds(EVERY_ENV, EVERY_S),
        _rank_zero(),
    )
    p.says_done = done_line
    if not p.shown:
        yield p
        return
    p.terminal = on_terminal()
    _REPORTER.add(p)
    ok = False
    try:
        yield p
        ok = True
    finally:
        _REPORTER.end(p, ok)


def times() -> dict[str, float]:
    """Seconds of the phases of this process that printed their line (those of `QUIET_S` or more), by key, summed."""
    with _REPORTER.lock:
        return dict(_REPORTER.times)
