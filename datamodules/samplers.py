"""Batch samplers that make every epoch reproducible across DDP ranks and across resume.

Training: one permutation per (seed, epoch), identical on every rank; each global batch of
`batch_size * world_size` examples is cut into `world_size` contiguous shards. Every example is seen exactly once
per epoch across ranks: nothing is padded by repetition (as `DistributedSampler` does) and nothing is dropped.
If the last global batch is too small to give every rank an example it is merged into the previous one, so all
ranks run the same number of steps (DDP needs that) and no rank gets an empty batch.

Resume: `ResumableLoader.state_dict()` records (epoch, batches consumed); on `load_state_dict` the sampler
re-creates the same permutation and skips the consumed batches, so a resumed run sees the same data in the same
order as an uninterrupted one. Lightning saves and restores loaders with this interface (`_Stateful`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from torch.utils.data import Sampler

from datamodules.guarded import GuardedLoader


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """Return the training order of `epoch`: a permutation of range(n) seeded by (seed, epoch), alike on all ranks."""
    return np.random.default_rng([seed, epoch]).permutation(n)


class DistributedTrainBatchSampler(Sampler[list]):
    """Yield this rank's training batches as lists of (epoch, example index), reproducible across ranks and resume.

    The dataset uses the epoch to seed per-example randomness (`data.rotation=per_epoch` rotation debiasing,
    passage-window draws), which keeps that randomness a function of (seed, epoch, example). Batching and sharding
    are described in the module docstring.
    """

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1, shuffle: bool = True):
        if n < world_size:
            raise ValueError(f"{n} training examples cannot feed {world_size} ranks")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
        self.epoch = 0
        self._skip = 0

    def _global_batches(self) -> Iterator[np.ndarray]:
        order = epoch_permutation(self.n, self.seed, self.epoch) if self.shuffle else np.arange(self.n)
        if self.n < 2**31:
            # the same indices in half the memory: MS MARCO's 39.8M triples are 318 MB as int64, held all epoch
            order = order.astype(np.int32)
        step, count = self.batch_size * self.world_size, len(self)
        # sliced as they are consumed, not kept as a list (2.5M array views at MS MARCO's size); the last global
        # batch takes the remainder when that is too small to give every rank an example (module docstring)
        for b in range(count):
            yield order[b * step : self.n if b == count - 1 else (b + 1) * step]

    def __len__(self) -> int:
        step = self.batch_size * self.world_size
        full, rest = divmod(self.n, step)
        return full + (1 if rest >= self.world_size or full == 0 else 0)

    @property
    def max_shard(self) -> int:
        """Return the most examples a rank gets in one batch: `batch_size`, or more in a merged last global batch."""
        count = len(self)
        last = self.n - (count - 1) * self.batch_size * self.world_size
        return max(self.batch_size if count > 1 else 0, -(-last // self.world_size))

    @property
    def sampler(self) -> DistributedTrainBatchSampler:
        """Return this batch sampler itself, so that Lightning's `set_epoch` calls reach it."""
        # Lightning calls set_epoch on `loader.sampler` and `loader.batch_sampler.sampler`, never on the batch
        # sampler itself; exposing ourselves as `.sampler` is how our set_epoch gets called.
        return self

    def set_epoch(self, epoch: int) -> None:
        """Use the permutation of `epoch` from the next iteration; a new epoch drops a pending resume skip."""
        if epoch != self.epoch:
            self._skip = 0
        self.epoch = epoch

    def resume(self, epoch: int, consumed: int) -> None:
        """Continue epoch `epoch` after its first `consumed` batches (the next epoch when all were consumed)."""
        if consumed >= len(self):  # saved at the end of an epoch: the next epoch starts fresh
            epoch, consumed = epoch + 1, 0
        self.epoch, self._skip = epoch, consumed

    def __iter__(self) -> Iterator[list]:
        skip, self._skip = self._skip, 0
        for i, global_batch in enumerate(self._global_batches()):
            if i < skip:
                continue
            shard = np.array_split(global_batch, self.world_size)[self.rank]
            yield [(self.epoch, int(j)) for j in shard]


class ResumableLoader(GuardedLoader):
    """A DataLoader whose position inside an epoch survives a checkpoint.

    `consumed()` returns the batches of the current epoch that the training loop has processed, read from the
    trainer at save time; the sampler's own count would be ahead of it by the batches that Lightning and the
    workers prefetch. The epoch is the sampler's: `trainer.current_epoch` already counts an epoch that
    `max_steps` cut short as finished.
    """

    def __init__(self, *args, consumed: Callable[[], int], **kwargs):
        super().__init__(*args, **kwargs)
        self._consumed = consumed

    def state_dict(self) -> dict:
        """Return the loader's position: the sampler's epoch and the batches the training loop has consumed."""
        return {"epoch": int(self.batch_sampler.epoch), "consumed": int(self._consumed())}

    def load_state_dict(self, state: dict) -> None:
        """Resume at the position `state_dict` recorded: the same epoch, its consumed batches skipped."""
        self.batch_sampler.resume(state["epoch"], state["consumed"])


def shard_range(n: int, rank: int, world_size: int) -> range:
    """Contiguous, unpadded shard of n evaluation items for one rank (results are gathered before metrics)."""
    bounds = np.linspace(0, n, world_size + 1).round().astype(int)
    return range(int(bounds[rank]), int(bounds[rank + 1]))
