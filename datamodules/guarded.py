"""DataLoaders whose failures name the example.

An exception inside `dataset[i]` or a worker process that dies (the OOM killer, a crash in a tokenizer) stops the run
with a RuntimeError naming the example index and the worker, never a hang and never a bare "worker exited
unexpectedly".

Each worker writes the example it is loading into a shared slot before loading it and clears it after, so when
PyTorch reports a dead worker (it checks its workers every few seconds) the slot still holds the example it died
on. An exception inside a worker is re-raised in the main process as one line with the example index instead of
PyTorch's nested traceback text.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re

from torch.utils.data import DataLoader, Dataset, get_worker_info


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


class GuardedLoader(DataLoader):
    """A DataLoader over `dataset` whose loading failures name the example (`what`: e.g. "training example")."""

    def __init__(self, dataset: Dataset, *args, what: str = "example", **kwargs):
        workers = int(kwargs.get("num_workers", 0))
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        slots, pids = (ctx.Array("q", [-1] * max(workers, 1), lock=False) for _ in range(2))
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
            return next(self.it)
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
