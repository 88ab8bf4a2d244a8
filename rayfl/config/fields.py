"""Field helpers of the schema: numeric bounds and path flags kept in a field's metadata (``bounded``), read by
the loader (``rayfl/experiment/loader.py``). Imports nothing of rayfl."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal

__all__ = ["FLOAT32_MAX", "bounded"]


def bounded(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    path: Literal["file", "dir", "any"] | None = None,
) -> Any:
    """A dataclass field with numeric bounds (and, for strings, an existence check) that the loader enforces."""
    meta = {k: v for k, v in {"ge": ge, "gt": gt, "le": le, "lt": lt, "path": path}.items() if v is not None}
    return field(default=default, metadata=meta)


# The largest float32: a client learning rate above it cannot scale float32 parameters (torch's optimizers raise).
FLOAT32_MAX = 3.4028234663852886e38
