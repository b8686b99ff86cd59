"""Dated results records (`results/YYYY-MM-DD-<slug>.md`), written by the command that measured them.

A record carries what results/README.md asks of every record: the command, the commit, the machine, the date and
the wall time, then the measured tables. `experiments.py grid=NAME record=true` writes one from the grid's table
(grid/engine.py); the reading (what the numbers say, why they may differ from the paper) is added by a person,
below the tables. A record is never overwritten: a second one on the same day gets `-2`, `-3`, ...
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from core.io import atomic_open
from core.versions import versions_line

__all__ = ["commit", "machine", "write_record", "RESULTS_DIR"]

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"


def commit(repo: Path = RESULTS_DIR.parent) -> str:
    """Return the short commit of `repo`.

    A note is added when tracked files have uncommitted changes; "unknown" outside git.
    """

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head} (with uncommitted changes)" if dirty else head


def machine() -> str:
    """CPU model and cores, memory, and the GPUs torch sees."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        mem = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB memory"
    except (ValueError, OSError, AttributeError):
        mem = ""
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return f"{cpu}, {os.cpu_count()} cores{mem}; " + (f"GPU: {', '.join(gpus)}" if gpus else "no GPU")


def _fmt_wall(seconds: float) -> str:
    h, rest = divmod(int(round(seconds)), 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s:02d} s"


def write_record(
    slug: str,
    title: str,
    command: str,
    body: str,
    wall_s: float | None = None,
    note: str = "",
    root: Path | None = None,
    date: dt.date | None = None,
) -> Path:
    """Write `<root>/<date>-<slug>.md` (atomically; `-2`, `-3`, ... when that name exists) and return its path."""
    date, root = date or dt.date.today(), root or RESULTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    path, n = root / f"{date.isoformat()}-{slug}.md", 1
    while path.exists():
        n += 1
        path = root / f"{date.isoformat()}-{slug}-{n}.md"
    lines = [f"# {title}", "", f"- Date: {date.isoformat()}", f"- Commit: {commit()}", f"- Machine: {machine()}"]
    if wall_s is not None:
        lines.append(f"- Wall time: {_fmt_wall(wall_s)}{note}")
    lines += [
        f"- Python {sys.version.split()[0]}; {versions_line()}",
        "- Command:",
        "",
        "```bash",
        command,
        "```",
        "",
        body.rstrip(),
        "",
    ]
    with atomic_open(path) as f:
        f.write("\n".join(lines))
    return path
