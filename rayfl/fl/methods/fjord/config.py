"""FjORD's configuration section (``algorithm.name: fjord``). Imports neither torch nor Ray: the registry and ``rayfl
validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfl.config.fields import width_ratios
from rayfl.fl.common.distill.config import DistillConfig

__all__ = ["FjORDConfig"]


@dataclass(frozen=True, kw_only=True)
class FjORDConfig:
    """FjORD (Horváth et al., NeurIPS 2021): ordered dropout; each client's maximum width is the largest of
    ``widths`` that fits its budgets, and every batch trains one width drawn uniformly from those up to it;
    ``kd``: self-distillation from the maximum width; sample-weighted element-wise mean."""

    name: Literal["fjord"] = "fjord"
    widths: tuple[float, ...] = width_ratios((0.2, 0.4, 0.6, 0.8, 1.0))
    kd: bool = True
    distill: DistillConfig = field(default_factory=DistillConfig)
