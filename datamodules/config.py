"""Keys shared by every data source (`configs/data/*.yaml`). Each source subclasses `DataConfig` with the
keys of its own files, so an unknown or misspelt key is an error for that source."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import check_choice


@dataclass
class DataConfig:
    source: str = "synthetic"
    batch_size: int = 16  # training triplets per optimiser step and rank
    # Evaluation step size: distinct passages for bi-encoders (each encoded once however many queries list it),
    # (query, passage) pairs for cross-encoders.
    eval_batch_size: int = 64
    num_workers: int = 0
    # When a split has no training triplets: negatives sampled from each query's BM25 candidates ("bm25") or
    # uniformly from the collection ("random"); "given" demands triplets from the source.
    negatives: str = "bm25"
    # When a split has no candidate lists: re-rank the BM25 top-k (bm25s) of each query.
    candidate_depth: int = 100
    max_train_triples: int | None = None
    max_eval_queries: int | None = None
    # Rotation debiasing (position-bias paper Eq. 7), separately for training and evaluation passages.
    rotate_train: bool = False
    rotate_eval: bool = False
    cache_dir: str = ".cache"
    # k-fold cross-validation over the judged queries of all splits (datamodules/folds.py), for sources without
    # training triples and candidate lists: test = fold `fold`, val = fold (fold + 1) % num_folds, train = the rest.
    # null = the source's own splits. `fold_seed` fixes the assignment (independent of the run seed).
    num_folds: int | None = None
    fold: int = 0
    fold_seed: int = 13

    def __post_init__(self):
        check_choice("data.negatives", self.negatives, ("bm25", "random", "given"))
