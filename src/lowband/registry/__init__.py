"""Name -> implementation tables for methods, models and data sets (lowband.catalog registers the
built-in ones; plugins loads users' own from `package.module:factory` strings).

A lookup of an unknown name raises a UsageError that lists the known names, so the command line
can answer a typo with the right spelling in one line.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from lowband.errors import UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of implementations, filled by `@registry.register("name")`."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = item
            return item
        return add

    def get(self, name: str) -> T:
        if name not in self._items:
            raise UsageError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items


METHODS: Registry = Registry("method")
MODELS: Registry = Registry("model")
DATASETS: Registry = Registry("dataset")

