"""The configuration of paper 004's FjORD (``algorithm.name: fjord004``). Imports neither torch nor Ray: the registry
and ``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded, width_ratios
from rayfl.fl.common.widths import CAPACITIES, COLUMN_RATIOS

__all__ = ["FjORD004Config"]


@dataclass(frozen=True, kw_only=True)
class FjORD004Config:
    """FjORD as paper 004 runs it (its Algorithm 4): each client the largest capacity of ``capacities`` that fits its
    budgets (nested first-k widths, as FedResCuE); per batch ``num_ratios`` (S) distinct widths of ``ratios`` below
    the client's own (relative to its capacity), each with cross-entropy + ``alpha`` x KL(the client model's detached
    output || its own), plus the client model's cross-entropy (back-propagation through the teacher), all gradients
    summed into one step; sample-weighted element-wise mean. Today's Flower-style FjORD is ``fjord``."""

    name: Literal["fjord004"] = "fjord004"
    capacities: tuple[float, ...] = CAPACITIES
    ratios: tuple[float, ...] = width_ratios(COLUMN_RATIOS, zero_ok=True)
    num_ratios: int = bounded(3, ge=0)
    alpha: float = bounded(1.0, ge=0.0)
