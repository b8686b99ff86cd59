"""DataLoaders whose failures name the example.

An exception inside `dataset[i]` or a worker process that dies (the OOM killer, a crash in a tokenizer) stops the run
with a RuntimeError naming the example index and the worker, never a hang and never a bare "worker exited
unexpectedly".

Each worker writes the example it is loading into a shared slot before loading it and clears it after, so when
PyTorch reports a dead worker (it checks its workers every few seconds) the slot still holds the example it died
on. An exception inside a worker is re-raised in the main process as one line with the example index instead of
PyTorch's nested traceback text.

A worker's batch crosses to the main process as a `ShippedBatch`: its tensors as NumPy arrays, pickled with it. A
tensor would cross as a shared-memory file descriptor, fetched from the worker over a socket, one round trip per
tensor (7 a training batch): on this project's 2-core CPU the main thread spent a median 3.7 ms receiving a
32-triple batch from one of 2 workers, 1.0 ms shipped, where making the batch in the process takes 2.3 ms; at 256
triples (1.6 MB through the pipe) both ways took about 4 ms (`python -m bench.bench_workers`,
results/2026-11-30-worker-batches.md). The main process (or, with pinned memory, the DataLoader's pin-memory thread,
through `ShippedBatch.pin_memory`) turns it back into the same batch.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import os
import re

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate, default_convert, get_worker_info


def _example(item) -> int:
    # training items are (epoch, example index); evaluation items are indices
    return int(item[-1] if isinstance(item, (tuple, list)) else item)


class ExampleError(RuntimeError):
    """Loading one example failed; `example` is its index in the dataset."""

    def __init__(self, what: str, example: int, cause: BaseException | str, worker: int | None = None):
        self.example = example
        where = f" in DataLoader worker {worker}" if worker is not None else ""
        reason = (
            cause
            if isinstance(cause, str)
            else f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
        )
        super().__init__(f"{what} {example}{where}: {reason}")


class _Tracked(Dataset):
    def __init__(self, dataset: Dataset, what: str, slots, pids):
        self.dataset, self.what, self.slots, self.pids = dataset, what, slots, pids

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name):
        if name in ("dataset", "what", "slots", "pids"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, item):
        info = get_worker_info()
        if info is not None:
            self.pids[info.id] = os.getpid()
            self.slots[info.id] = _example(item)
        try:
            out = self.dataset[item]
        except Exception as e:
            raise ExampleError(self.what, _example(item), e, None if info is None else info.id) from e
        if info is not None:
            self.slots[info.id] = -1
        return out


class _Shipped:
    """One tensor of a `ShippedBatch`, as the NumPy array that shares its memory (pickled by value)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array


def _ship(data):
    if isinstance(data, torch.Tensor):
        if data.device.type == "cpu" and not data.requires_grad and data.dtype in _NUMPY_DTYPES:
            return _Shipped(data.numpy())
        return data  # a dtype NumPy lacks (bfloat16): sent as PyTorch sends it
    return _each(data, _ship)


def _each(data, fn):
    """Return `data` with `fn` applied to each item of its dicts, lists and tuples (types kept), else `data`."""
    if isinstance(data, dict):
        out = copy.copy(data)  # a dict subclass keeps its type, as PyTorch's pin_memory keeps it
        out.update({k: fn(v) for k, v in data.items()})
        return out
    if isinstance(data, list):
        return [fn(v) for v in data]
    if isinstance(data, tuple):
        return type(data)(*map(fn, data)) if hasattr(data, "_fields") else tuple(map(fn, data))
    return data


def _land(data, pin: bool):
    if isinstance(data, _Shipped):
        t = torch.from_numpy(data.array)
        return t.pin_memory() if pin else t
    if isinstance(data, torch.Tensor):
        return data.pin_memory() if pin else data
    return _each(data, lambda v: _land(v, pin))


_NUMPY_DTYPES = {
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
}


class ShippedBatch:
    """A batch made in a DataLoader worker, its tensors (in dicts, lists and tuples) held as NumPy arrays.

    `unpack()` returns the batch with the same tensors (sharing the arrays' memory); `pin_memory()`, which the
    DataLoader's pin-memory thread calls, returns it in page-locked memory.
    """

    __slots__ = ("data",)

    def __init__(self, batch):
        self.data = _ship(batch)

    def unpack(self):
        """Return the batch, its tensors back as tensors."""
        return _land(self.data, pin=False)

    def pin_memory(self, device=None):
        """Return the batch, its tensors in page-locked memory (the DataLoader's pin-memory thread)."""
        return _land(self.data, pin=True)


class _ShippingCollate:
    """The loader's collate function; in a worker its batch is returned as a `ShippedBatch`."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, items):
        batch = self.collate(items)
        return ShippedBatch(batch) if get_worker_info() is not None else batch


class GuardedLoader(DataLoader):
    """A DataLoader over `dataset` whose loading failures name the example (`what`: e.g. "training example")."""

    def __init__(self, dataset: Dataset, *args, what: str = "example", **kwargs):
        workers = int(kwargs.get("num_workers", 0))
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        slots, pids = (ctx.Array("q", [-1] * max(workers, 1), lock=False) for _ in range(2))
        if workers > 0 and not args:
            # PyTorch's own default: collate batches (a batch size or batch sampler), else convert single items
            batched = kwargs.get("batch_size", 1) is not None or kwargs.get("batch_sampler") is not None
            collate = kwargs.get("collate_fn") or (default_collate if batched else default_convert)
            kwargs["collate_fn"] = _ShippingCollate(collate)
        super().__init__(_Tracked(dataset, what, slots, pids), *args, **kwargs)
        self._what, self._slots, self._pids = what, slots, pids

    def __iter__(self):
        it = super().__iter__()
        return _GuardedIter(it, self)


class _GuardedIter:
    def __init__(self, it, loader: GuardedLoader):
        self.it, self.loader = it, loader

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.it)

    def __getattr__(self, name):
        return getattr(self.it, name)

    def __next__(self):
        try:
            batch = next(self.it)
            return batch.unpack() if isinstance(batch, ShippedBatch) else batch
        except StopIteration:
            raise
        except ExampleError:
            raise
        except RuntimeError as e:
            msg = str(e)
            # an ExampleError raised in a worker arrives re-wrapped by PyTorch ("Caught ExampleError in DataLoader
            # worker process N. Original Traceback ..."): keep its own line
            inner = re.search(r"ExampleError: (.+)$", msg.strip())
            if inner:
                m = re.match(r"(.*?) (\d+)( in DataLoader worker \d+)?: (.*)", inner.group(1))
                if m:
                    raise ExampleError(m.group(1), int(m.group(2)), m.group(4), _worker_of(msg)) from None
            # PyTorch names a dead worker two ways, depending on which notices first: its SIGCHLD handler
            # ("DataLoader worker (pid 123) is killed by signal: Killed." / "... exited unexpectedly with exit code
            # 1") or the queue poll ("DataLoader worker (pid(s) 123, 124) exited unexpectedly")
            died = re.search(
                r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\) (?:exited unexpectedly|is killed by signal)", msg
            )
            if died:
                dead = {int(p) for p in re.findall(r"\d+", died.group(1))}
                slots, pids = self.loader._slots, self.loader._pids
                loading = [(w, int(slots[w])) for w in range(len(slots)) if slots[w] >= 0 and pids[w] in dead]
                if loading:
                    w, i = loading[0]
                    raise ExampleError(
                        self.loader._what, i, f"the worker process died while loading it ({msg})", w
                    ) from e
            raise


def _worker_of(msg: str) -> int | None:
    m = re.search(r"DataLoader worker process (\d+)", msg)
    return int(m.group(1)) if m else None
