"""Write the result directory of every evaluation.

Every evaluation (train.py, evaluate.py, BM25, dense and ColBERT end-to-end retrieval) writes:

    per_query.json   {qid: {measure: value}}: every measure for every query (for significance tests)
    run.trec         the run, TREC format (metrics/trec.py)
    metrics.json     the means over queries, plus whatever the caller adds (settings, before-training results)
    versions.json    what made them: the exact versions of the libraries (core/versions.py) and what the caller adds
                     (the tokenizer's name and digests, the BM25 stemmer)

plus, from the pipeline, `config.yaml` (the resolved config that produced them) and `validation.json`. The files are
written as one set (core.io.result_set): staged in a hidden folder, then renamed into place with metrics.json last and
SIGINT / SIGTERM held, so a folder holds either its earlier result or the new one, and metrics.json (the mark of a
finished run, which experiments.py and resume look for) is never beside files of another run. A write failure is one
WriteFault naming the file and the OS's reason, with the earlier results unchanged.

Every job prints its measures through `print_table`, one layout for all: a row per measure under the name metrics.json
gives it, a column per result (`value`, or e.g. before / after training).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from rich.console import Console
from rich.table import Table

from core.io import atomic_open, result_set, write_json
from core.versions import library_versions
from metrics.trec import write_trec_run

__all__ = ["write_result_dir", "print_table"]


def write_result_dir(
    out: str | os.PathLike,
    metrics: Mapping,
    per_query: Mapping,
    run: Mapping[str, Mapping[str, float]],
    tag: str,
    config: str | None = None,
    extra: Mapping[str, object] | None = None,
    retire: tuple = (),
    folders: Mapping[str, Callable[[Path], object]] | None = None,
    files: Mapping[str, Path] | None = None,
    versions: Mapping[str, object] | None = None,
) -> None:
    """Write one evaluation's results to `out` as one set: per_query.json, run.trec, metrics.json (module docstring).

    `config`: the resolved config (YAML text), written as config.yaml with the results; `extra`: more JSON files
    of the set ({name: object}, e.g. validation.json); `folders`: folders of the set, each written by its function
    into the path it is given (e.g. {"index": index.save}); `files`: files copied into the set ({name: path}, e.g. an
    attempt's figures); `retire`: files removed when the set is in place (a pending attempt's config and figures);
    `versions`: what versions.json holds beside the libraries' versions (e.g. {"tokenizer": ..., "stemmer": ...}).
    """
    with result_set(out, retire=tuple(retire)) as tmp:
        for name, save in (folders or {}).items():
            save(tmp / name)
        for name, obj in (extra or {}).items():
            write_json(tmp / name, obj)
        for name, src in (files or {}).items():
            shutil.copyfile(src, tmp / name)
        # a file of its own, so that metrics.json holds what was measured and stays comparable byte for byte
        write_json(tmp / "versions.json", {"libraries": library_versions(), **(versions or {})})
        write_json(tmp / "per_query.json", per_query)
        write_trec_run(tmp / "run.trec", run, tag=tag)
        if config is not None:
            with atomic_open(tmp / "config.yaml") as f:
                f.write(config)
        write_json(tmp / "metrics.json", metrics)


def print_table(columns: Mapping[str, Mapping[str, float]], title: str = "test metrics") -> None:
    """Print a job's measures as the one results table every job prints (train.py, evaluate.py, BM25, retrieval).

    `columns`: {column heading: {measure: value}}, e.g. {"value": means} or {"before training": b, "after": a}; a row
    per measure of the last column, in its order, under its metrics.json name; a measure a column lacks is `-`.
    """
    table = Table(title=title)
    table.add_column("metric")
    for heading in columns:
        table.add_column(heading, justify="right")
    rows = list(columns.values())[-1] if columns else {}
    for k in rows:
        table.add_row(k, *(_cell(col[k]) if k in col else "-" for col in columns.values()))
    Console().print(table)


def _cell(v) -> str:
    if v is None:  # not measurable (e.g. MATS with too few passages): as a missing measure
        return "-"
    return f"{v:.4f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
