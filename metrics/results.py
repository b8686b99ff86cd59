"""Write the result directory of every evaluation.

Every evaluation (train.py, evaluate.py, BM25, dense and ColBERT end-to-end retrieval) writes:

    per_query.json   {qid: {measure: value}}: every measure for every query (for significance tests)
    run.trec         the run, TREC format (metrics/trec.py)
    metrics.json     the means over queries, plus whatever the caller adds (settings, before-training results)

plus, from the pipeline, `config.yaml` (the resolved config that produced them) and `validation.json`. The files are
written as one set (core.io.result_set): staged in a hidden folder, then renamed into place with metrics.json last and
SIGINT / SIGTERM held, so a folder holds either its earlier result or the new one, and metrics.json (the mark of a
finished run, which experiments.py and resume look for) is never beside files of another run. A write failure is one
WriteFault naming the file and the OS's reason, with the earlier results unchanged.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from core.io import atomic_open, result_set, write_json
from metrics.trec import write_trec_run

__all__ = ["write_result_dir"]


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
) -> None:
    """Write one evaluation's results to `out` as one set: per_query.json, run.trec, metrics.json (module docstring).

    `config`: the resolved config (YAML text), written as config.yaml with the results; `extra`: more JSON files
    of the set ({name: object}, e.g. validation.json); `folders`: folders of the set, each written by its function
    into the path it is given (e.g. {"index": index.save}); `files`: files copied into the set ({name: path}, e.g. an
    attempt's figures); `retire`: files removed when the set is in place (a pending attempt's config and figures).
    """
    with result_set(out, retire=tuple(retire)) as tmp:
        for name, save in (folders or {}).items():
            save(tmp / name)
        for name, obj in (extra or {}).items():
            write_json(tmp / name, obj)
        for name, src in (files or {}).items():
            shutil.copyfile(src, tmp / name)
        write_json(tmp / "per_query.json", per_query)
        write_trec_run(tmp / "run.trec", run, tag=tag)
        if config is not None:
            with atomic_open(tmp / "config.yaml") as f:
                f.write(config)
        write_json(tmp / "metrics.json", metrics)
