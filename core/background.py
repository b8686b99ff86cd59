"""Run an iterable on a thread of its own, a bounded number of items ahead of its consumer.

`background(iterable, depth)` yields what `iterable` yields, in order, while a daemon thread makes the next items: at
most `depth` items made and not yet taken, the one being made included (so `depth=1` makes item k + 1 while the
consumer works on item k, and holds no more). The two overlap where the producer's work releases the GIL: Hugging Face
fast tokenizers, file reads, NumPy fills and copies. An exception in the producer reaches the consumer as itself (same
type and message), after every item made before it, so an error surfaces where it would have without the thread.
Closing the generator (the consumer stopping early, or failing) stops the producer after the item it is making and
joins it: no thread outlives the loop.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["background"]

T = TypeVar("T")

_DONE = object()


class _Raised:
    """The producer's exception, carried through the queue in its place in the sequence."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def background(iterable: Iterable[T], depth: int = 1, name: str = "background") -> Iterator[T]:
    """Yield the items of `iterable`, made on a thread at most `depth` items ahead; see the module docstring."""
    if depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth}")
    items: queue.SimpleQueue = queue.SimpleQueue()
    slots = threading.Semaphore(depth)  # items the producer may make before the consumer takes one
    stop = threading.Event()

    def produce() -> None:
        try:
            it = iter(iterable)
            while True:
                slots.acquire()
                if stop.is_set():
                    return
                try:
                    item = next(it)
                except StopIteration:
                    items.put(_DONE)
                    return
                items.put(item)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            items.put(_Raised(e))

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.error
            slots.release()
            yield item
    finally:
        stop.set()
        slots.release()  # a producer waiting for a slot wakes, sees `stop` and ends
        thread.join()
