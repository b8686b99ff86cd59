"""The floor a re-ranker must clear: the expected effectiveness of a RANDOM order of the same candidate lists.

    python evaluate.py analysis=random_rerank \
        analysis.run=outputs/grids/dgre_cranfield/bert_cat/cranfield/fold0/run.trec \
        data=cranfield data.num_folds=5 data.fold=0 output_dir=outputs/random-cranfield-fold0 \
        [analysis.split=test] [analysis.permutations=200] [analysis.seed=0]

Reads the run (any TREC run: its documents per query are the candidates, their scores are ignored), the qrels of
`analysis.split` of the configured data, shuffles each query's candidates `analysis.permutations` times (numpy,
seeded with `analysis.seed`) and reports the mean and standard deviation over permutations of every measure in
`eval.measures` (trec_eval semantics, metrics/ir.py): printed, written to `<output_dir>/random_rerank.json` and
logged as `random_rerank/<measure>/mean|std`. A neural re-ranker of the BM25 top k that lands near these numbers
has learnt little about the ranking yet. Keys: configs/analysis/random_rerank.yaml.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from analyses.outputs import analysis_set, log_analysis, write_result
from analyses.registry import ANALYSES, AnalysisConfig, analysis_options
from core.errors import InputError, check_choice
from core.inputs import check_input_file, input_path
from datamodules.corpus import SPLITS
from datamodules.sources import data_config, load_dataset, used_splits
from datamodules.textfiles import read_trec_run
from metrics.ir import evaluate_run
from metrics.results import print_table

JSON_NAME = "random_rerank.json"


@dataclass
class RandomRerankConfig(AnalysisConfig):
    """configs/analysis/random_rerank.yaml."""

    reads_eval: ClassVar[tuple[str, ...]] = ("measures",)  # the measures of the floor, as a test reports them

    name: str = "random_rerank"
    run: str | None = input_path("file", "a TREC run")  # whose documents per query are the candidates (required)
    split: str = "test"  # the split whose qrels judge the run: train | val | test
    permutations: int = 200  # random orders per query
    seed: int = 0  # of the permutations

    def splits_read(self) -> tuple[str, ...] | None:
        """Return the split whose qrels judge the run (`split`)."""
        return used_splits(self.split)

    def __post_init__(self):
        if not self.run:
            raise InputError(
                "config key 'analysis.run'",
                "is not set; expected the TREC run whose candidates are shuffled (analysis.run=PATH)",
            )
        check_choice("analysis.split", self.split, SPLITS)
        if self.permutations < 1:
            raise InputError("config key 'analysis.permutations'", f"is {self.permutations}; expected at least 1")


def random_rerank(
    candidates: Mapping[str, list[str]],
    qrels: Mapping[str, Mapping[str, int]],
    measures: list[str],
    permutations: int,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """{measure: {"mean", "std"}} over `permutations` random orders of every query's candidates."""
    rng = np.random.default_rng(seed)
    values: dict[str, list[float]] = {m: [] for m in measures}
    qrels = {q: dict(qrels[q]) for q in candidates if q in qrels}
    for _ in range(permutations):
        run = {q: {d: float(s) for d, s in zip(docs, rng.permutation(len(docs)))} for q, docs in candidates.items()}
        means, _ = evaluate_run(run, qrels, measures)
        for m in measures:
            values[m].append(means[m])
    return {m: {"mean": float(np.mean(v)), "std": float(np.std(v))} for m, v in values.items()}


def run(cfg, opts: RandomRerankConfig) -> dict:
    """Check the run against the split's qrels (nothing written before), then the random-order statistics."""
    check_input_file(opts.run, "config key 'analysis.run'", "a TREC run")
    trec = read_trec_run(opts.run)
    split = load_dataset(data_config(cfg), cfg.seed, opts.splits_read()).split(opts.split)
    missing = sorted(set(trec) - set(split.qrels))
    if missing:
        raise InputError(
            opts.run,
            f"query '{missing[0]}' has no qrels in split {opts.split} of the configured data; "
            "expected the run of that split",
        )
    candidates = {q: sorted(docs) for q, docs in trec.items()}
    result = random_rerank(candidates, split.qrels, list(cfg.eval.measures), opts.permutations, opts.seed)
    doc = {
        "run": opts.run,
        "split": opts.split,
        "queries": len(candidates),
        "permutations": opts.permutations,
        "seed": opts.seed,
        "random_order": result,
    }
    with analysis_set(cfg.output_dir, JSON_NAME) as stage:
        write_result(stage, JSON_NAME, doc)
    path = Path(cfg.output_dir) / JSON_NAME
    log_analysis(
        cfg,
        "random_rerank",
        scalars={f"random_rerank/{m}/{stat}": v[stat] for m, v in result.items() for stat in ("mean", "std")},
        summary={"random_rerank": doc},
    )
    # the measures as every job prints them (metrics/results.py); the settings are in the JSON
    print_table(
        {stat: {m: v[stat] for m, v in result.items()} for stat in ("mean", "std")},
        title=f"{opts.split} metrics of a random order ({opts.permutations} permutations, {len(candidates)} queries)",
    )
    print(f"wrote {path}")
    return doc


@ANALYSES.register("random_rerank", schema=RandomRerankConfig)
def _from_config(cfg, model_from_cli: bool = False) -> dict:
    return run(cfg, analysis_options(cfg))
