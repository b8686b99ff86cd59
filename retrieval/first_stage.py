"""First-stage retrievers: `model` choices that rank the whole collection by themselves and have nothing to train.

The `model` config group holds the neural rankers (`models.rankers.RANKERS`) and these (`FIRST_STAGE`), each
in a registry of its own. A first-stage entry's schema validates its `model` keys like a ranker's, its `build(cfg)`
runs the whole evaluate.py job (rank the collection, evaluate, write) and returns the metric means, and it declares
the capabilities of a model that is no ranker (`NO_CAPABILITIES`: no vectors, no index, not trainable), so
train.py and grids decide by `model_capabilities(name).trainable`.

    python evaluate.py model=bm25 data=cranfield model.split=all model.depth=1000 output_dir=outputs/bm25-cranfield

BM25 (bm25s over `model.split`, scored with trec_eval semantics): retrieval/bm25.py, through `BM25Index`, the
`bm25` family of the index interface (retrieval/base.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import InputError, check_choice
from core.ranges import COUNT, NON_NEGATIVE, PROBABILITY, check_ranges
from core.registry import Entry, Registry
from datamodules.bm25 import METHODS, BM25Params
from datamodules.corpus import SPLITS
from datamodules.sources import used_splits
from models.rankers import RANKERS
from models.rankers.capabilities import NO_CAPABILITIES, RankerCapabilities
from retrieval.bm25 import run_bm25

FIRST_STAGE: Registry = Registry("first-stage retriever")


@dataclass
class BM25Config:
    """`model: bm25`: the bm25s variant and parameters, the retrieval depth and whose queries are run."""

    name: str = "bm25"
    method: str = "lucene"  # bm25s variant (Kamphuis et al. 2020)
    k1: float = 1.5
    b: float = 0.75
    depth: int = 1000  # documents retrieved per query
    # whose queries: train | val | test (the split neural rankers are tested on, so rows compare) | all (every judged
    # query of every split, the usual setting for published BM25 figures on the classic collections)
    split: str = "test"

    def splits_read(self) -> tuple[str, ...] | None:
        """Return the splits whose queries it runs (`split`; `all`: every split), as `run_bm25` loads them."""
        return used_splits(self.split)

    def __post_init__(self):
        check_choice("model.method", self.method, METHODS)
        check_choice("model.split", self.split, (*SPLITS, "all"))
        check_ranges("model", self, k1=NON_NEGATIVE, b=PROBABILITY, depth=COUNT)


@FIRST_STAGE.register("bm25", schema=BM25Config, capabilities=NO_CAPABILITIES)
def evaluate_bm25(cfg) -> dict[str, float]:
    """Run BM25 over the whole collection for `model.split`'s queries; write the results and return the means."""
    m = cfg.model
    return run_bm25(cfg, str(m.split), int(m.depth), BM25Params(m.method, float(m.k1), float(m.b)))


def first_stage(name: str) -> Entry | None:
    """Return the first-stage retriever registered as `name`, or None when `name` is a ranker (or unknown)."""
    return FIRST_STAGE.get(name) if name in FIRST_STAGE else None


def model_entry(name: str, where: str = "model.name") -> Entry:
    """Return the entry of the `model` choice `name`: a ranker or a first-stage retriever.

    An unknown name is an InputError at `where` listing both registries' names.
    """
    for registry in (RANKERS, FIRST_STAGE):
        if name in registry:
            return registry.get(name)
    raise InputError(
        where, f"unknown model '{name}'; expected one of {sorted([*RANKERS.names(), *FIRST_STAGE.names()])}"
    )


def model_capabilities(name: str, where: str = "model.name") -> RankerCapabilities:
    """Return what the `model` choice `name` can do, from the name alone (nothing is built; unknown: InputError)."""
    return model_entry(name, where).capabilities or NO_CAPABILITIES


__all__ = ["FIRST_STAGE", "BM25Config", "first_stage", "model_entry", "model_capabilities"]
