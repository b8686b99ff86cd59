"""The result directory of every evaluation (train.py, evaluate.py, BM25, dense and ColBERT end-to-end retrieval):

    per_query.json   {qid: {measure: value}}: every measure for every query (for significance tests)
    run.trec         the run, TREC format (metrics/trec.py)
    metrics.json     the means over queries, plus whatever the caller adds (settings, before-training results)

Each file is written atomically, metrics.json last: its presence marks a finished run (experiments.py skips such
cells), so a crash never leaves a folder that looks finished.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from core.io import write_json
from metrics.trec import write_trec_run

__all__ = ["write_result_dir"]


def write_result_dir(out: str | os.PathLike, metrics: Mapping, per_query: Mapping, run: Mapping[str, Mapping[str, float]], tag: str) -> None:
    out = Path(out)
    write_json(out / "per_query.json", per_query)
    write_trec_run(out / "run.trec", run, tag=tag)
    write_json(out / "metrics.json", metrics)
