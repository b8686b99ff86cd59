"""Out of accelerator memory during evaluation: retry the batch in halves (as Lightning IR does).

Never give up on the run because one batch of long passages did not fit.

`halving(fn, batch)` calls `fn` on a dict of row-aligned tensors; on `torch.OutOfMemoryError` it frees the cache, splits
every tensor with the batch's row count in two, recurses on each half and concatenates the results (tensors, `Encoded`
token vectors padded to a common length, or dicts of them). A single row that does not fit re-raises. Results equal the
unsplit call's: evaluation runs each row independently (no batch statistics at inference).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from models.rankers.base import Encoded


def _rows(batch: dict) -> int:
    return max(v.shape[0] for v in batch.values() if isinstance(v, Tensor) and v.ndim > 0)


def _half(batch: dict, n: int, sl: slice) -> dict:
    return {k: v[sl] if isinstance(v, Tensor) and v.ndim > 0 and v.shape[0] == n else v for k, v in batch.items()}


def _cat(parts: list):
    if isinstance(parts[0], dict):  # several readings of one pass (encoding.variants_forward)
        return {k: _cat([p[k] for p in parts]) for k in parts[0]}
    if isinstance(parts[0], Tensor):
        return torch.cat(parts)
    length = max(p.tokens.shape[1] for p in parts)
    return Encoded(
        tokens=torch.cat([F.pad(p.tokens, (0, 0, 0, length - p.tokens.shape[1])) for p in parts]),
        mask=torch.cat([F.pad(p.mask, (0, length - p.mask.shape[1])) for p in parts]),
        sequence=None if parts[0].sequence is None else torch.cat([p.sequence for p in parts]),
    )


def halving(fn: Callable, batch: dict, what: str, on_retry: Callable[[int], None] | None = None):
    """Return `fn(batch)`, retried in halves (recursively) on out-of-memory; see the module docstring.

    `what` names the work in the warning ("encoding passages"); `on_retry(n)` is called with the row count of each
    batch that is split.
    """
    try:
        return fn(batch)
    except torch.OutOfMemoryError:
        n = _rows(batch)
        if n <= 1:
            raise
    # outside the except block, so the failed attempt's tensors (held by the traceback) can be freed
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    warnings.warn(f"out of memory {what} on {n} rows; retrying in halves of {(n + 1) // 2} and {n // 2}", stacklevel=2)
    if on_retry is not None:
        on_retry(n)
    mid = (n + 1) // 2
    return _cat([halving(fn, _half(batch, n, sl), what, on_retry) for sl in (slice(0, mid), slice(mid, n))])
