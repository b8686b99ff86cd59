"""BM25 (bm25s) as a first-stage retriever: a full-collection run, evaluated with trec_eval semantics.

    python evaluate.py model=bm25 data=cranfield output_dir=outputs/bm25-cranfield [model.split=all] [model.depth=1000]
                       [model.method=lucene] [model.k1=1.5] [model.b=0.75]

Any data source (`data=vaswani`, `data=tsv data.collection=...`, `data=ir_datasets ...`, folds with
`data.num_folds=5 data.fold=k`). `model.split` picks the queries: `train`, `val`, `test` (default, the split neural
rankers are tested on, so rows compare) or `all` (every judged query of every split, the usual setting for published
BM25 figures on the classic collections). Writes into `output_dir`, as evaluate.py does: `run.trec`,
`per_query.json` and `metrics.json` (means over `eval.measures`, plus the BM25 settings); metrics.json last,
atomically, so the experiment runner treats the folder as a finished cell. Scoring and tie-breaking:
datamodules/bm25.py; the config keys and the registration as `model=bm25`: retrieval/first_stage.py (`BM25Config`).
"""

from __future__ import annotations

import warnings

from omegaconf import OmegaConf

from core.errors import InputError
from datamodules.bm25 import BM25Params, bm25_run, no_candidates_warning, settings
from datamodules.config import empty_split
from datamodules.corpus import SPLITS
from datamodules.sources import data_config, load_dataset, used_splits
from metrics.ir import evaluate_run
from metrics.results import write_result_dir

__all__ = ["split_queries", "run_bm25"]


def split_queries(ds, split: str) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """Return (queries, qrels) of one split, or of all splits together for `all`."""
    if split != "all":
        s = ds.split(split)
        return dict(s.queries), dict(s.qrels)
    queries, qrels = {}, {}
    for name in SPLITS:
        if name in ds.splits:
            queries.update(ds.splits[name].queries)
            qrels.update(ds.splits[name].qrels)
    return queries, qrels


_DEFAULT_PARAMS = BM25Params()


def run_bm25(cfg, split: str = "test", k: int = 1000, params: BM25Params = _DEFAULT_PARAMS) -> dict[str, float]:
    """Rank the whole collection for `split`'s queries (`model.split`), keeping the top `k` (`model.depth`).

    Evaluates the run and writes it into `cfg.output_dir` (see the module docstring); returns the metric means.
    """
    if split not in (*SPLITS, "all"):
        raise InputError("config key 'model.split'", f"got '{split}'; expected one of {[*SPLITS, 'all']}")
    if k <= 0:
        raise InputError("config key 'model.depth'", f"is {k}; expected a positive number of documents per query")
    dc = data_config(cfg)
    ds = load_dataset(dc, cfg.seed, used_splits(split))  # validated before anything is written
    queries, qrels = split_queries(ds, split)
    judged = sum(1 for q in qrels if any(g > 0 for g in qrels[q].values()))
    if not judged:
        raise empty_split(
            dc, split, f"has no judged query to evaluate ({len(queries)} queries, none with a relevant document)"
        )
    rankings = bm25_run(ds.docs, queries, k, dc.cache_dir, f"{ds.name}-{split}-run", params)
    run = {q: dict(r) for q, r in rankings.items()}
    empty = [q for q in sorted(queries) if not run[q] and any(g > 0 for g in qrels.get(q, {}).values())]
    if empty:
        warnings.warn(no_candidates_warning(f"model=bm25, split '{split}'", empty), stacklevel=2)
    means, per_query = evaluate_run(run, qrels, list(cfg.eval.measures))
    write_result_dir(
        cfg.output_dir,
        {
            **means,
            "bm25": {
                **settings(params),
                "split": split,
                "k": k,
                "docs": len(ds.docs),
                "queries": len(queries),
                "judged_queries": judged,
            },
        },
        per_query,
        run,
        tag=f"bm25-{params.method}",
        config=OmegaConf.to_yaml(cfg),
    )
    return means
