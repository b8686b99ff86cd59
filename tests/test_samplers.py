"""The training batch sampler: every example exactly once per epoch across ranks, same batches on every rank
count, reproducible per (seed, epoch), and resumable mid-epoch."""

import itertools

import pytest

from datamodules.samplers import DistributedTrainBatchSampler, shard_range


def epoch_items(n, bs, world, epoch, seed=7):
    samplers = [DistributedTrainBatchSampler(n, bs, seed, rank=r, world_size=world) for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    return [list(s) for s in samplers]


@pytest.mark.parametrize("n,bs,world", [(100, 8, 1), (100, 8, 2), (101, 8, 2), (17, 4, 3), (33, 16, 2), (2, 16, 2)])
def test_each_example_once_per_epoch_across_ranks(n, bs, world):
    per_rank = epoch_items(n, bs, world, epoch=3)
    lengths = {len(batches) for batches in per_rank}
    assert len(lengths) == 1, "all ranks must run the same number of steps"
    assert lengths.pop() == len(DistributedTrainBatchSampler(n, bs, 7, 0, world))
    seen = [i for batches in per_rank for b in batches for (_, i) in b]
    assert sorted(seen) == list(range(n))
    assert all(len(b) > 0 for batches in per_rank for b in batches)
    assert all(e == 3 for batches in per_rank for b in batches for (e, _) in b)
    # the in-batch negatives' padding (HOST_RANK_ROWS) is the largest batch any rank gets
    assert DistributedTrainBatchSampler(n, bs, 7, 0, world).max_shard == max(len(b) for r in per_rank for b in r)


def test_ddp_shards_concatenate_to_single_process_batches():
    # With the global batch fixed, 2 ranks of batch 4 see exactly the single-process batches of 8.
    single = epoch_items(64, 8, 1, epoch=0)[0]
    r0, r1 = epoch_items(64, 4, 2, epoch=0)
    for b, a0, a1 in zip(single, r0, r1):
        assert b == a0 + a1


def test_epochs_differ_and_repeat():
    a = epoch_items(50, 5, 1, epoch=0)[0]
    assert a == epoch_items(50, 5, 1, epoch=0)[0]
    assert a != epoch_items(50, 5, 1, epoch=1)[0]


def test_resume_skips_consumed_batches():
    full = epoch_items(40, 4, 1, epoch=2)[0]
    s = DistributedTrainBatchSampler(40, 4, 7)
    s.resume(epoch=2, consumed=3)
    assert list(s) == full[3:]
    assert list(s) == full  # the skip applies once; the next pass of the same epoch is whole again


def test_resume_at_epoch_end_starts_next_epoch():
    s = DistributedTrainBatchSampler(40, 4, 7)
    s.resume(epoch=2, consumed=10)
    assert s.epoch == 3
    assert list(s) == epoch_items(40, 4, 1, epoch=3)[0]


def test_shard_range_partitions():
    for n, w in itertools.product([0, 1, 5, 17], [1, 2, 3]):
        parts = [shard_range(n, r, w) for r in range(w)]
        assert [i for p in parts for i in p] == list(range(n))
