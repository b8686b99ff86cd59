"""The floor a re-ranker must clear: the expected effectiveness of a RANDOM order of the same candidate lists.

    python -m analyses.random_rerank --run outputs/grids/dgre_cranfield/bert_cat/cranfield/fold0/run.trec \
        data=cranfield data.num_folds=5 data.fold=0 [--split test] [--permutations 200] [--seed 0]

Reads the run (any TREC run: its documents per query are the candidates, their scores are ignored), the qrels of
`--split` of the configured data (same `key=value` config as train.py, validated), shuffles each query's candidates
`--permutations` times (numpy, seeded) and prints the mean and standard deviation over permutations of every
measure in `eval.measures` (trec_eval semantics, metrics/ir.py). A neural re-ranker of the BM25 top k
that lands near these numbers has learnt little about the ranking yet.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Mapping

import numpy as np

from pipeline.cli import run_tool


def random_rerank(candidates: Mapping[str, list[str]], qrels: Mapping[str, Mapping[str, int]], measures: list[str],
                  permutations: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """{measure: {"mean", "std"}} over `permutations` random orders of every query's candidates."""
    from metrics.ir import evaluate_run

    rng = np.random.default_rng(seed)
    values: dict[str, list[float]] = {m: [] for m in measures}
    qrels = {q: dict(qrels[q]) for q in candidates if q in qrels}
    for _ in range(permutations):
        run = {q: {d: float(s) for d, s in zip(docs, rng.permutation(len(docs)))} for q, docs in candidates.items()}
        means, _ = evaluate_run(run, qrels, measures)
        for m in measures:
            values[m].append(means[m])
    return {m: {"mean": float(np.mean(v)), "std": float(np.std(v))} for m, v in values.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m analyses.random_rerank", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="TREC run whose documents per query are the candidates")
    ap.add_argument("--split", default="test", help="the split whose qrels judge the run (default test)")
    ap.add_argument("--permutations", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)

    def job(cfg, opts) -> None:
        from core.errors import InputError
        from datamodules.sources import data_config, load_dataset
        from metrics.trec import read_trec_run

        if opts.permutations < 1:
            raise InputError("--permutations", f"is {opts.permutations}; expected at least 1")
        run = read_trec_run(opts.run)
        split = load_dataset(data_config(cfg), cfg.seed).split(opts.split)
        missing = sorted(set(run) - set(split.qrels))
        if missing:
            raise InputError(opts.run, f"query '{missing[0]}' has no qrels in split {opts.split} of the configured data; expected the run of that split")
        candidates = {q: sorted(docs) for q, docs in run.items()}
        result = random_rerank(candidates, split.qrels, list(cfg.eval.measures), opts.permutations, opts.seed)
        print(json.dumps({"run": opts.run, "queries": len(candidates), "permutations": opts.permutations, "random_order": result}, indent=1))

    return run_tool(ap, argv, job)


if __name__ == "__main__":
    sys.exit(main())
