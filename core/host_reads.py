"""Device values read on the host a step later, so that the host never waits for the device's newest work.

A Python decision on a CUDA tensor (`if t:`, `t.item()`) blocks the host until the device has run everything queued
before it: the device then idles while the host prepares the next step. `DeferredReads` starts the copy of a few
values to pinned host memory when they are computed (non-blocking, an event recorded behind it) and hands them out
once a later step has been queued, waiting, if at all, only for the work queued before that event.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch
from torch import Tensor


class DeferredReads:
    """A queue of small device tensors whose values the host reads later, in the order they were pushed."""

    def __init__(self) -> None:
        self._pending: list[tuple[Hashable, Tensor, torch.cuda.Event | None]] = []

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, tag: Hashable, values: Tensor) -> None:
        """Start copying `values` (a 1-D tensor) to the host behind the work queued so far, under `tag`."""
        values = values.detach()
        if values.device.type != "cuda":
            # CPU work has already run when the call returns; other devices copy synchronously (no events here)
            self._pending.append((tag, values.to("cpu").clone(), None))
            return
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((tag, host, event))

    def pop(self, keep_last: int = 0) -> list[tuple[Hashable, list[float]]]:
        """Return (tag, values) of every pushed entry but the newest `keep_last`, oldest first, and forget them.

        Waits only for each entry's own copy: work queued after it (the step being computed) keeps running.
        """
        n = max(0, len(self._pending) - keep_last)
        done, self._pending = self._pending[:n], self._pending[n:]
        out = []
        for tag, host, event in done:
            if event is not None:
                event.synchronize()
            out.append((tag, host.tolist()))
        return out
