"""Errors every layer may raise about a run's configuration, and the key paths they name.

``ConfigError`` is an invalid experiment configuration located by key path, file and line (or override); lower layers
(data loaders, model factories, trace readers) raise it too, so that bad input is one line wherever it is found.
Imports nothing of rayfl."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError", "KeyPath", "Problem", "RunLostError"]

# A key path inside the raw tree: mapping keys are strings, list positions are ints.
KeyPath = tuple[str | int, ...]
# A problem a rule found: where (a key path) and why.
Problem = tuple[KeyPath, str]


class ConfigError(ValueError):
    """An invalid experiment configuration, located by key path, file and line (or override)."""

    def __init__(
        self,
        reason: str,
        key_path: str = "",
        file: str | None = None,
        line: int | None = None,
        override: str | None = None,
    ) -> None:
        self.reason = reason
        self.key_path = key_path
        self.file = file
        self.line = line
        self.override = override
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.file if self.file is not None else "<config>"
        if self.override is not None:
            where = f"{where}: override '{self.override}'"
        elif self.line is not None:
            where = f"{where}:{self.line}"
        if self.key_path:
            return f"{where}: {self.key_path}: {self.reason}"
        return f"{where}: {self.reason}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.key_path, self.file, self.line, self.override))


class RunLostError(RuntimeError):
    """A run gave up on what trains its clients (dead Ray actors or a node: ``engine/ray/recovery.py``; a dead
    in-process worker: ``engine/exec/workers.py``). Its message is one line, for the CLI; the driver of a written run
    adds where to resume from (``resume_hint``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = ""

    def resume_hint(self, hint: str) -> None:
        """Add ``hint`` (how to resume the run) to the message."""
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}{self.hint}"
