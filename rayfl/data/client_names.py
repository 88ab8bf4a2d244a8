"""Client names made when read: ``prefix`` and the zero-padded client id, for loaders that number their clients.

A tuple of a million names is about 70 MB in every process that unpickles the data set and a second of start-up; the
names of numbered clients follow from the id, so they are formatted only when asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

__all__ = ["NumberedNames"]


class NumberedNames(Sequence[str]):
    """``f"{prefix}{c:0{width}d}"`` for ``c`` in ``range(count)``, as a read-only sequence."""

    def __init__(self, prefix: str, count: int, width: int) -> None:
        self.prefix, self.size, self.width = prefix, count, width

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(self._name(c) for c in range(*index.indices(self.size)))
        c = index + self.size if index < 0 else index
        if not 0 <= c < self.size:
            raise IndexError(f"client {index} out of range for {self.size} clients")
        return self._name(c)

    def _name(self, c: int) -> str:
        return f"{self.prefix}{c:0{self.width}d}"

    def __iter__(self) -> Iterator[str]:
        return (self._name(c) for c in range(self.size))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NumberedNames):
            return (self.prefix, self.size, self.width) == (other.prefix, other.size, other.width)
        return isinstance(other, Sequence) and not isinstance(other, str) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash((self.prefix, self.size, self.width))

    def __repr__(self) -> str:
        return f"NumberedNames({self.prefix!r}, {self.size}, {self.width})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (NumberedNames, (self.prefix, self.size, self.width))
