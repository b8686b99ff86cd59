"""Dated records under results/ (results/README.md): `YYYY-MM-DD-<slug>.md` with its command, commit, machine and date,
and a `.tsv` of its table's rows beside it.

A record is never rewritten: a second record of the same slug and date is written as `<date>-<slug>-2.md` (and so on).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

from core.versions import versions_line

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"


def git_commit() -> str:
    """The checkout's short commit, with a note when tracked files differ from it.

    Outside a git checkout (a working tree copied to a GPU machine without .git), the `BENCH_COMMIT` environment
    variable names it (bench/gpu_session.sh sets it from .gpu/COMMIT, written by bench/gpu_carry.py here).
    """
    if not (REPO / ".git").exists() and os.environ.get("BENCH_COMMIT"):
        return f"{os.environ['BENCH_COMMIT']} (a copy of the working tree, as bench/gpu_carry.py found it)"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head} (with uncommitted changes to tracked files)" if dirty else head


def command_line(module: str, argv: list[str] | None = None) -> str:
    """`python -m <module> key=value ...`: the command as results/README.md writes benchmarks."""
    args = sys.argv[1:] if argv is None else [str(a) for a in argv]
    return " ".join(["python", "-m", module, *args])


def relative(text: str) -> str:
    """`text` with this checkout's absolute path cut from the paths in it (results/README.md: repository paths)."""
    return text.replace(str(REPO) + "/", "")


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def record_paths(folder: str | Path, slug: str, date: dt.date) -> tuple[Path, Path]:
    """(`<folder>/<date>-<slug>.md`, `.tsv`), numbered `-2`, `-3`, ... when that record exists already."""
    folder = Path(folder)
    stem, n = f"{date.isoformat()}-{slug}", 1
    while (folder / f"{stem}.md").exists() or (folder / f"{stem}.tsv").exists():
        n += 1
        stem = f"{date.isoformat()}-{slug}-{n}"
    return folder / f"{stem}.md", folder / f"{stem}.tsv"


def cell(value, digits: int = 2) -> str:
    """A table cell: floats to `digits` decimals, None as a dash."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if abs(value) >= 10 ** (1 - digits) or value == 0 else f"{value:.{digits}g}"
    return str(value)


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A Markdown table of `rows` (dicts): `columns` are (key, heading) pairs; a column no row has a value in is left
    out."""
    columns = [(k, h) for k, h in columns if any(r.get(k) is not None for r in rows)]
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(k)) for k, _ in columns) + " |" for r in rows]
    return "\n".join(lines)


def tsv_text(rows: list[dict], columns: list[str]) -> str:
    """Tab-separated rows under a header line; None as an empty field, no rounding."""

    def field(v) -> str:
        return "" if v is None else str(v).replace("\t", " ").replace("\n", " ")

    return "".join("\t".join(field(r.get(c)) for c in columns) + "\n" for r in [dict(zip(columns, columns)), *rows])


def write_record(
    folder: str | Path,
    slug: str,
    title: str,
    facts: list[tuple[str, str]],
    body: str,
    rows: list[dict],
    columns: list[str],
    when: dt.datetime,
) -> tuple[Path, Path]:
    """Write `<date>-<slug>.md` (title, the facts as a list, then `body`) and its `.tsv` (`rows` x `columns`).

    The facts end with `Versions`: the exact versions of the libraries (core/versions.py).
    """
    md, tsv = record_paths(folder, slug, when.date())
    md.parent.mkdir(parents=True, exist_ok=True)
    head = [
        f"# {title}",
        "",
        *(f"- {k}: {v}" for k, v in [*facts, ("Versions", versions_line())]),
        "",
        f"Rows as measured: [{tsv.name}]({tsv.name}).",
        "",
    ]
    md.write_text("\n".join(head) + "\n" + body.strip() + "\n")
    tsv.write_text(tsv_text(rows, columns))
    return md, tsv
