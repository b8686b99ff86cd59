"""Name -> implementation registries, so YAML chooses rankers, data sources, heads and metrics by name.

Each entry also carries a dataclass schema: the config of that entry is validated against it, which is
what makes unknown keys and wrong types errors instead of silent no-ops. An entry may carry `capabilities`, what the
implementation can do (e.g. `models.rankers.RankerCapabilities`): code that must choose between
implementations asks them, from the name alone and before anything is built, instead of comparing names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from core.errors import InputError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered implementation: its `name`, the `build` callable that makes it, its config `schema`.

    Also `capabilities`, what the implementation declares it can do (None: the registry declares none).
    """

    name: str
    build: Callable[..., T]
    schema: type | None  # dataclass describing the entry's config keys
    capabilities: Any = None


def _same_definition(a: Callable, b: Callable) -> bool:
    """Tell whether `a` and `b` are the same source definition imported twice.

    `python -m pkg.mod` runs mod as __main__, and the registry's own import of pkg.mod then registers it again (the
    later definition wins).
    """
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (
        code_a is not None
        and code_b is not None
        and a.__qualname__ == b.__qualname__
        and code_a.co_filename == code_b.co_filename
        and code_a.co_firstlineno == code_b.co_firstlineno
    )


class Registry(Generic[T]):
    """Name -> implementation registry of one `kind` (rankers, data sources, heads, metrics), filled by `register`."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(
        self, name: str, schema: type | None = None, capabilities: Any = None
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Return a decorator that registers the decorated builder under `name`, its config checked against `schema`.

        `capabilities` is what the implementation declares it can do (`Entry.capabilities`).

        Another definition under a name already taken is a RuntimeError; the same definition imported twice (see
        `_same_definition`) replaces the first.
        """

        def deco(build: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries and not _same_definition(self._entries[name].build, build):
                raise RuntimeError(f"{self.kind} '{name}' registered twice")
            self._entries[name] = Entry(name, build, schema, capabilities)
            return build

        return deco

    def get(self, name: str, where: str | None = None) -> Entry[T]:
        """Return the entry registered as `name`; an unknown name is an InputError at `where` listing the known ones.

        `where` defaults to the registry's kind.
        """
        if name not in self._entries:
            raise InputError(
                where or self.kind, f"unknown {self.kind} '{name}'; expected one of {sorted(self._entries)}"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        """Return the registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: Any) -> bool:
        return name in self._entries
