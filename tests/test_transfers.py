"""core/transfers.to_device: host data onto a device without a host sync (the pinned path needs CUDA: the recorder
of tests/test_host_sync.py checks that training steps copy host data only through it)."""

from __future__ import annotations

import numpy as np
import torch

from core.transfers import to_device


def test_on_the_cpu_an_array_is_shared_not_copied():
    a = np.array([3, 1, 2], dtype=np.int64)
    t = to_device(a, torch.device("cpu"))
    assert t.dtype == torch.int64 and t.tolist() == [3, 1, 2]
    a[0] = 7  # the same memory: nothing was copied
    assert t[0].item() == 7
    cpu = torch.arange(4)
    assert to_device(cpu, "cpu") is cpu


def test_another_device_gets_a_copy_of_the_values():
    t = to_device(np.arange(6, dtype=np.float32).reshape(2, 3), "meta")
    assert t.device.type == "meta" and t.shape == (2, 3) and t.dtype == torch.float32
