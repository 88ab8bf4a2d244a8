"""Field helpers of the schema: numeric bounds and path flags kept in a field's metadata (``bounded``), read by
the loader (``rayfl/experiment/loader.py``), and the mark of a list of width ratios (``width_ratios``), read by the
experiment's rules (``rayfl/experiment/rules.py``). Imports nothing of rayfl."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal

__all__ = ["FLOAT32_MAX", "WIDTH_RATIOS", "bounded", "width_ratios"]


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


# The metadata key of a list of width ratios: True when a ratio may be 0 (a skippable block removed), else False.
WIDTH_RATIOS = "width_ratios"


def width_ratios(default: tuple[float, ...], *, zero_ok: bool = False) -> Any:
    """A dataclass field holding width ratios (a method's ``rates``, ``ratios`` or ``widths``): the rules check that
    it lists at least one value, each in ``(0, 1]`` (``[0, 1]`` with ``zero_ok``), one of them positive."""
    return field(default=default, metadata={WIDTH_RATIOS: zero_ok})


# The largest float32: a client learning rate above it cannot scale float32 parameters (torch's optimizers raise).
FLOAT32_MAX = 3.4028234663852886e38
