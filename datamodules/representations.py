"""Data for the post-hoc head stage (`train.py stage=head`).

Training batches are rows of the on-disk representation cache (models/heads/cache.py); validation and test
are the usual re-ranking splits.

The batches come from the same sampler as fine-tuning (`DistributedTrainBatchSampler`): one seeded permutation
per (seed, epoch), sharded across DDP ranks without padding, and resumable mid-epoch through `ResumableLoader`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from datamodules.datamodule import RankingDataModule
from datamodules.samplers import DistributedTrainBatchSampler, ResumableLoader


class CachedVectors(Dataset):
    """The rows of the representation cache as a Dataset: item (epoch, row) -> that row as a float32 tensor.

    Indexed by `DistributedTrainBatchSampler`'s (epoch, example index) pairs; the epoch is ignored.
    """

    def __init__(self, vectors: np.ndarray):
        self.vectors = vectors  # a read-only memmap: rows are read when a batch asks for them

    def __len__(self) -> int:
        return len(self.vectors)

    def __getitem__(self, item: tuple[int, int]) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.vectors[item[1]], dtype=np.float32))


def training_texts(dm: RankingDataModule, max_texts: int | None, seed: int) -> tuple[list[str], list[str]]:
    """Return the distinct training queries and passages (positives and negatives of the triplets).

    In first-seen order; with `max_texts`, a seeded sample of that many texts, split between queries and passages in
    proportion.
    """
    queries_of = dm.dataset.split("train").queries
    triples = dm.triples
    if hasattr(triples, "distinct"):
        # memory-mapped triples (datamodules/triples.py): distinct rows by array passes, texts read only for the
        # sample; a passage's text is read from the store by row
        qidx, rows = triples.distinct()
        queries = _Lazy(qidx, lambda q: queries_of[triples.qids[q]])
        docs = _Lazy(rows, triples.docs.text_at)
    else:
        queries = list(dict.fromkeys(queries_of[q] for q, _, _ in triples))
        docs = list(dict.fromkeys(dm.dataset.docs[d] for _, p, n in triples for d in (p, n)))
    if max_texts is not None and len(queries) + len(docs) > max_texts:
        rng = np.random.default_rng([seed, 4])
        n_q = round(max_texts * len(queries) / (len(queries) + len(docs)))
        queries = [queries[i] for i in np.sort(rng.permutation(len(queries))[:n_q])]
        docs = [docs[i] for i in np.sort(rng.permutation(len(docs))[: max_texts - n_q])]
    return list(queries), list(docs)


class _Lazy:
    """Texts of `keys`, read by `read` when indexed."""

    def __init__(self, keys: np.ndarray, read):
        self.keys, self.read = keys, read

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> str:
        return self.read(int(self.keys[i]))


class HeadDataModule(RankingDataModule):
    """RankingDataModule whose training loader yields cached representation vectors (set `vectors` before fit)."""

    vectors: np.ndarray | None = None
    head_batch_size: int = 1024

    def train_dataloader(self) -> ResumableLoader:
        """Return the resumable loader of cached vectors: `head_batch_size` rows a batch, seeded and DDP-sharded."""
        rank, world = self._rank_world()
        ds = CachedVectors(self.vectors)
        sampler = DistributedTrainBatchSampler(len(ds), self.head_batch_size, self.seed, rank, world)
        return ResumableLoader(
            ds, batch_sampler=sampler, num_workers=0, consumed=self._consumed, generator=self._generator()
        )
