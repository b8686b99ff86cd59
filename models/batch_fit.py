"""`batch_size: auto` for encoding: batches as large as the device's memory allows.

On the CPU a larger batch buys nothing (the forward's cost grows with its tokens, and one core team runs it), so
`auto` is `CPU_BATCH` texts there, the fixed default before `auto`. On an accelerator each batch costs a fixed share of
host work (padding, launching the forward's kernels, copying the vectors back, storing them) that the device waits for
when batches are small: on an H200, dense encoding of MiniLM-shaped passages in batches of 256 left the GPU idle about
11 of every 17 ms (results/2026-11-29-gpu-speed-h200.md). There `auto` measures what a text costs in device memory
and takes the largest batch that fits in `MEMORY_SHARE` of what is free, up to `ACCELERATOR_CAP`:

1. two probe forwards of the longest texts the side allows (`PROBE_ROWS`, a few and several times more, all tokens
   real), each under the encoder's own autocast, inference mode and output copy, their peak allocations above what
   was allocated before (`DeviceMemory.peak_bytes`);
2. the slope between them is a text's cost, the rest a fixed cost (workspaces); rows = (share x free - fixed) /
   slope, rounded down to a multiple of `MULTIPLE`, at least 1 and at most the cap.

The probe is the worst case: encoding sorts texts longest first and pads a batch to its own longest, never beyond the
side's maximum length. `MEMORY_SHARE` leaves room for the batch before (its vectors wait for their copy to the host
while the next forward runs) and for the allocator's rounding. A batch that still runs out of memory is retried in
halves (models/oom.py). Where the device has no memory statistics (`memory_of` is None: the CPU, MPS), `auto` is
`CPU_BATCH`.

The window of texts sorted together is set by the ceiling (`ceiling`: CPU_BATCH or ACCELERATOR_CAP, by the device's
kind alone), so processes that split a collection (retrieval/split.py) cut the same windows whatever memory each of
them has free; only their batches within a window may differ, and with them the vectors' float rounding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from core.ranges import Range

__all__ = [
    "AUTO",
    "BATCH",
    "CPU_BATCH",
    "ACCELERATOR_CAP",
    "MEMORY_SHARE",
    "PROBE_ROWS",
    "DeviceMemory",
    "Fit",
    "memory_of",
    "ceiling",
    "rows_that_fit",
    "fit_batch",
]

AUTO = "auto"
BATCH = Range(1, also=(AUTO,), integer=True)  # an encoding batch size key: a count, or auto
CPU_BATCH = 64  # texts per batch where the device has no memory statistics (the CPU): the default before auto
# beyond about a thousand texts a batch the host's share per text is already small, while the host's buffers (the
# pinned copies, 8 batches of texts in a sorting window) grow with the batch
ACCELERATOR_CAP = 1024
MEMORY_SHARE = 0.5  # of the device's free memory, for one batch's forward and output
PROBE_ROWS = (4, 16)  # texts in the two probe forwards
MULTIPLE = 8  # batch sizes are multiples of 8 (the tensor cores' tile) once above it


class DeviceMemory:
    """What encoding reads of a device's memory: its free bytes, and the peak allocation of a piece of work.

    The CUDA implementation (`memory_of`) reads PyTorch's caching allocator; tests give their own.
    """

    def free_bytes(self) -> int:
        """Bytes a new allocation can take: the device's free memory and what the allocator holds unused."""
        raise NotImplementedError

    def peak_bytes(self, work: Callable[[], object]) -> int:
        """Run `work` and return its peak allocation above what was allocated before it started."""
        raise NotImplementedError


class _CudaMemory(DeviceMemory):
    def __init__(self, device: torch.device):
        self.device = device

    def free_bytes(self) -> int:
        free, _total = torch.cuda.mem_get_info(self.device)
        return int(free + torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device))

    def peak_bytes(self, work: Callable[[], object]) -> int:
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        work()
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device) - before)


def memory_of(device: torch.device) -> DeviceMemory | None:
    """Return the memory statistics of `device`, or None where PyTorch keeps none (the CPU, MPS)."""
    if device.type == "cuda":
        return _CudaMemory(device)
    return None


def ceiling(memory: DeviceMemory | None) -> int:
    """Return the largest batch `auto` may choose: `ACCELERATOR_CAP` with memory statistics, else `CPU_BATCH`."""
    return CPU_BATCH if memory is None else ACCELERATOR_CAP


@dataclasses.dataclass(frozen=True)
class Fit:
    """A batch size chosen by `fit_batch`, and what it was chosen from (None: nothing measured)."""

    rows: int
    row_bytes: float | None = None  # device memory per text of the probe's length
    fixed_bytes: float | None = None  # what the probe allocated whatever its rows
    free_bytes: int | None = None

    def describe(self, unit: str) -> str:
        """One line for the log: the batch and the measures behind it."""
        if self.row_bytes is None:
            return f"{self.rows} {unit} per batch"
        mib = 2**20
        return (
            f"{self.rows} {unit} per batch ({self.row_bytes / mib:.2f} MiB a text at the longest, "
            f"{self.free_bytes / 2**30:.1f} GiB free)"
        )


def rows_that_fit(free_bytes: float, row_bytes: float, fixed_bytes: float, cap: int) -> int:
    """Return the texts a batch may hold: (MEMORY_SHARE x free - fixed) / per text, a multiple of 8, in [1, cap].

    >>> rows_that_fit(free_bytes=2**30, row_bytes=2**20, fixed_bytes=0, cap=1024)  # 512 MiB of 1 MiB texts
    512
    >>> rows_that_fit(free_bytes=2**30, row_bytes=3 * 2**20, fixed_bytes=2**26, cap=1024)  # (512 - 64) / 3 = 149.3
    144
    >>> rows_that_fit(free_bytes=2**34, row_bytes=2**20, fixed_bytes=0, cap=1024), rows_that_fit(2**20, 2**20, 0, 64)
    (1024, 1)
    """
    rows = int((MEMORY_SHARE * free_bytes - fixed_bytes) // max(row_bytes, 1.0))
    if rows >= MULTIPLE:
        rows -= rows % MULTIPLE
    return max(1, min(rows, cap))


def fit_batch(memory: DeviceMemory | None, probe: Callable[[int], object]) -> Fit:
    """Choose `auto`'s batch size: see the module docstring.

    `probe(rows)` encodes `rows` texts of the side's maximum length as encoding does (autocast, inference mode, the
    output copied to the host). Without memory statistics: `CPU_BATCH`, and nothing is probed.
    """
    if memory is None:
        return Fit(CPU_BATCH)
    small, large = PROBE_ROWS
    peaks = [memory.peak_bytes(lambda n=n: probe(n)) for n in (small, large)]
    row = (peaks[1] - peaks[0]) / (large - small)
    if row <= 0:  # the allocator's rounding hid the difference: every byte counted per text, an overestimate
        row, fixed = peaks[1] / large, 0.0
    else:
        fixed = max(0.0, peaks[0] - small * row)
    free = memory.free_bytes()
    return Fit(rows_that_fit(free, row, fixed, ceiling(memory)), row, fixed, free)
