"""datamodules/guarded.py ShippedBatch: a worker's batch crosses as NumPy arrays and lands as the same batch."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import torch
from torch.utils.data import Dataset
from torch.utils.data._utils.pin_memory import pin_memory

from datamodules.guarded import GuardedLoader, ShippedBatch, _Shipped

Pair = namedtuple("Pair", "a b")


class Tagged(dict):
    """A dict subclass (as a tokenizer's batch may be): its type must survive."""


def sample_batch() -> dict:
    return Tagged(
        ids=torch.arange(6).reshape(2, 3),
        mask=torch.tensor([[True, False], [True, True]]),
        half=torch.ones(2, dtype=torch.float16),
        brain=torch.ones(2, dtype=torch.bfloat16),  # no NumPy dtype: crosses as PyTorch sends it
        host={"lengths": np.array([3, 1])},  # NumPy stays NumPy
        rows=3,
        pair=Pair(torch.zeros(2), "text"),
        parts=[torch.ones(1), (torch.zeros(1),)],
    )


def assert_same(got, want):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and torch.equal(got, want)
    elif isinstance(want, np.ndarray):
        assert np.array_equal(got, want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    else:
        assert got == want


def leaves(data):
    if isinstance(data, dict):
        return [x for v in data.values() for x in leaves(v)]
    if isinstance(data, (list, tuple)):
        return [x for v in data for x in leaves(v)]
    return [data]


def test_a_shipped_batch_unpacks_to_the_same_batch():
    batch = sample_batch()
    shipped = ShippedBatch(batch)
    tensors = [x for x in leaves(shipped.data) if isinstance(x, torch.Tensor)]
    assert [t.dtype for t in tensors] == [torch.bfloat16]  # every other tensor travels as an array
    assert sum(isinstance(x, _Shipped) for x in leaves(shipped.data)) == 6
    assert_same(shipped.unpack(), batch)


def test_the_pin_memory_thread_pins_every_tensor(monkeypatch):
    """PyTorch's pin-memory thread calls `ShippedBatch.pin_memory`: every tensor of the batch comes back pinned."""
    pinned = []

    def fake_pin(self, *args, **kwargs):  # no accelerator here: stand in for page-locked copies
        copy = self.clone()
        pinned.append(copy)
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    batch = sample_batch()
    got = pin_memory(ShippedBatch(batch))
    assert_same(got, batch)
    assert {id(t) for t in leaves(got) if isinstance(t, torch.Tensor)} == {id(t) for t in pinned}
    assert len(pinned) == 7


class Items(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        return {"ids": torch.full((3,), i), "host": np.array([i])}


def test_loaders_with_workers_give_the_in_process_batches():
    """Batches (collated and unbatched) through a worker equal those made in the process, tensors as tensors."""
    for kwargs in (dict(batch_size=2), dict(batch_size=None)):
        alone = list(GuardedLoader(Items(), num_workers=0, **kwargs))
        shipped = list(GuardedLoader(Items(), num_workers=1, **kwargs))
        assert len(shipped) == len(alone) > 0
        for got, want in zip(shipped, alone):
            assert_same(got, want)
