"""BM25 (bm25s) as a ranker of its own: a full-collection run, evaluated with trec_eval semantics.

    python -m retrieval.bm25 data=cranfield output_dir=outputs/bm25-cranfield [--split all] [--k 1000]
                             [--method lucene] [--k1 1.5] [--b 0.75]

Same `key=value` data config as evaluate.py (any source: `data=vaswani`, `data=tsv data.collection=...`,
`data=ir_datasets ...`, folds with `data.num_folds=5 data.fold=k`). `--split` picks the queries: `train`, `val`,
`test` (default, the split neural rankers are tested on, so rows compare) or `all` (every judged query of every
split, the usual setting for published BM25 figures on the classic collections). Writes into `output_dir`, as
evaluate.py does: `run.trec`, `per_query.json` and `metrics.json` (means over `eval.measures`, plus the BM25
settings); metrics.json last, atomically, so the experiment runner treats the folder as a finished cell.
Scoring and tie-breaking: datamodules/bm25.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

from core.errors import InputError
from datamodules.bm25 import METHODS, BM25Params, bm25_run, settings
from datamodules.corpus import SPLITS
from pipeline.cli import run_tool

__all__ = ["split_queries", "run_bm25", "main"]


def split_queries(ds, split: str) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """(queries, qrels) of one split, or of all splits together for `all`."""
    if split != "all":
        s = ds.split(split)
        return dict(s.queries), dict(s.qrels)
    queries, qrels = {}, {}
    for name in SPLITS:
        if name in ds.splits:
            queries.update(ds.splits[name].queries)
            qrels.update(ds.splits[name].qrels)
    return queries, qrels


def run_bm25(cfg, split: str = "test", k: int = 1000, params: BM25Params = BM25Params()) -> dict[str, float]:
    from core.io import write_json
    from datamodules.sources import data_config, load_dataset
    from metrics.ir import evaluate_run
    from metrics.trec import write_trec_run

    if split not in (*SPLITS, "all"):
        raise InputError("--split", f"is '{split}'; expected one of {[*SPLITS, 'all']}")
    if k <= 0:
        raise InputError("--k", f"is {k}; expected a positive number of documents per query")
    dc = data_config(cfg)
    ds = load_dataset(dc, cfg.seed)  # validated before anything is written
    queries, qrels = split_queries(ds, split)
    if not queries:
        raise InputError("--split", f"split '{split}' of dataset {ds.name} has no queries")
    rankings = bm25_run(ds.docs, queries, k, dc.cache_dir, f"{ds.name}-{split}-run", params)
    run = {q: dict(r) for q, r in rankings.items()}
    means, per_query = evaluate_run(run, qrels, list(cfg.eval.measures))
    out = Path(cfg.output_dir)
    write_trec_run(out / "run.trec", run, tag=f"bm25-{params.method}")
    write_json(out / "per_query.json", per_query)
    judged = sum(1 for q in qrels if any(g > 0 for g in qrels[q].values()))
    write_json(out / "metrics.json", {**means, "bm25": {**settings(params), "split": split, "k": k, "docs": len(ds.docs),
                                                         "queries": len(queries), "judged_queries": judged}})
    return means


def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m retrieval.bm25", description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="test", help="train, val, test or all")
    ap.add_argument("--k", type=int, default=1000, help="documents retrieved per query")
    ap.add_argument("--method", default="lucene", choices=METHODS)
    ap.add_argument("--k1", type=float, default=1.5)
    ap.add_argument("--b", type=float, default=0.75)

    def job(cfg, opts) -> None:
        means = run_bm25(cfg, opts.split, opts.k, BM25Params(opts.method, opts.k1, opts.b))
        for name, v in means.items():
            print(f"{name}\t{v:.4f}")

    return run_tool(ap, argv, job)


if __name__ == "__main__":
    sys.exit(main())
