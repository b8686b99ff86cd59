"""Name -> implementation registries, so YAML chooses rankers, data sources, heads and metrics by name.

Each entry also carries a dataclass schema: the config of that entry is validated against it, which is
what makes unknown keys and wrong types errors instead of silent no-ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from pipeline.errors import InputError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    build: Callable[..., T]
    schema: type | None  # dataclass describing the entry's config keys


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, schema: type | None = None) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def deco(build: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise RuntimeError(f"{self.kind} '{name}' registered twice")
            self._entries[name] = Entry(name, build, schema)
            return build

        return deco

    def get(self, name: str, where: str | None = None) -> Entry[T]:
        if name not in self._entries:
            raise InputError(where or self.kind, f"unknown {self.kind} '{name}'; expected one of {sorted(self._entries)}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: Any) -> bool:
        return name in self._entries
