"""The configuration section of the core method, dynamic model search with in-place distillation (paper 000). Imports
neither torch nor Ray: the registry and ``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfl.config.fields import bounded
from rayfl.fl.common.distill.config import DistillConfig

__all__ = ["ModelSearchConfig"]


@dataclass(frozen=True, kw_only=True)
class ModelSearchConfig:
    """Dynamic model search with federated in-place distillation (paper 000): each client the structure with the
    largest ``criterion`` that fits its memory and bandwidth, found in a sampling pool grown by epsilon / ``t_max``
    constrained random search over per-dimension ratios ``ratios`` (S; 0 removes a skippable block); count-normalised
    element-wise mean; in-place distillation on Gaussian inputs after aggregation (``distill``)."""

    name: Literal["model_search"] = "model_search"
    ratios: tuple[float, ...] = (0.0, 0.5, 1.0)
    epsilon: float = bounded(0.8, ge=0.0, le=1.0)
    t_max: int = bounded(5, ge=0)
    criterion: Literal["params", "memory", "bytes"] = "params"
    admit: Literal["all", "fitting"] = "all"
    distill: DistillConfig = field(default_factory=lambda: DistillConfig(enabled=True))
