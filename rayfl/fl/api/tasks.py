"""Server-side parallel work a method may ask for (FedorAS's search): a map over items.

``TaskPool.map(fn, shared, items)`` returns ``[fn(*shared, item) for item in items]`` in item order. The engine hands a
method the pool matching its backend (``LocalTaskPool`` in-process, Ray tasks on the Ray backend:
``rayfl/engine/ray/server_tasks.py``). ``fn`` must be a pure, module-level function (it is pickled to Ray workers), so
both pools give the same results."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["LocalTaskPool", "TaskPool"]

T = TypeVar("T")


class TaskPool(Protocol):
    """Runs a pure function over items, possibly in parallel; results in item order."""

    def map(self, fn: Callable[..., T], shared: Sequence[Any], items: Sequence[Any]) -> list[T]: ...


class LocalTaskPool:
    """In this process, one item after another."""

    def map(self, fn: Callable[..., T], shared: Sequence[Any], items: Sequence[Any]) -> list[T]:
        return [fn(*shared, item) for item in items]
