"""The one registry kind: name → object of one kind (unlearning methods, attackers, evaluators, stage kinds, MC
variant presets, the metric table's functions), filled by registrations as their modules are imported.

A :class:`Registry` is a read-only mapping, frozen by its owner once its modules are imported (a registration after
that, or a name registered twice, is a bug: ``ValueError``); an unknown name is the user's
(:class:`~margincal.core.errors.InputError` naming the known ones, as ``unknown method 'x'; known methods: ...``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

from margincal.core.errors import InputError

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Objects of one ``kind`` by name (``plural`` names them in messages), starting with ``entries``; with
    ``fold_case`` names are matched case-insensitively and kept lower-case."""

    def __init__(self, kind: str, plural: str, fold_case: bool = False, entries: Mapping[str, T] | None = None) -> None:
        self.kind, self.plural, self.fold_case = kind, plural, fold_case
        self._entries: dict[str, T] = {}
        self.frozen = False
        for name, entry in (entries or {}).items():
            self.add(name, entry)

    def _key(self, name: str) -> str:
        return name.lower() if self.fold_case else name

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name``; a name registered twice, or after :meth:`freeze`, stops (a bug, not an
        input)."""
        if self.frozen:
            raise ValueError(f"{self.kind} {name!r} is registered after the {self.plural} were frozen")
        if self._key(name) in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[self._key(name)] = entry
        return entry

    def freeze(self) -> Registry[T]:
        """Take no more registrations (called where the registering modules have all been imported); returns the
        registry."""
        self.frozen = True
        return self

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator registering what it decorates under ``name``."""
        return lambda entry: self.add(name, entry)

    def lookup(self, name: str) -> T:
        """The entry named ``name``; an unknown name stops with the known ones."""
        if self._key(name) not in self._entries:
            raise InputError(f"unknown {self.kind} {name!r}; known {self.plural}: {', '.join(sorted(self))}")
        return self._entries[self._key(name)]

    def __getitem__(self, name: str) -> T:
        return self._entries[self._key(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._key(name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
