"""Host data onto the device without waiting for the device: the mirror of core/host_reads.py.

A copy from pageable host memory to a CUDA device (`tensor.to("cuda")`, `torch.tensor(data, device="cuda")`,
`torch.as_tensor(array, device="cuda")`) makes the host wait until every kernel already queued on the stream has
run: CUDA stages pageable memory before its copy can start (CUDA's "API synchronization behavior"). Inside a training
step that is a sync like `.item()`. Staged in page-locked memory instead, the copy is queued like a kernel; PyTorch's
caching host allocator keeps the staging block until the copy's event has passed.

>>> import numpy as np
>>> to_device(np.array([2, 0, 1]), "cpu")
tensor([2, 0, 1])
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["to_device"]


def to_device(data: np.ndarray | Tensor, device: torch.device | str) -> Tensor:
    """Return `data` (a NumPy array or a CPU tensor) as a tensor on `device`, queued without a host sync on CUDA.

    On the CPU the tensor shares the array's memory (no copy); other devices get a plain copy.
    """
    t = torch.as_tensor(data)
    device = torch.device(device)
    if device.type == "cpu":
        return t
    if device.type != "cuda":
        return t.to(device)
    if not t.is_pinned():
        t = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    return t.to(device, non_blocking=True)
