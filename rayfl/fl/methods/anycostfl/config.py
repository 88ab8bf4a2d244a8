"""AnyCostFL's configuration section (``algorithm.name: anycostfl``). Imports neither torch nor Ray: the registry and
``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfl.config.fields import width_ratios
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.common.widths import HETEROFL_RATES

__all__ = ["AnyCostFLConfig"]


@dataclass(frozen=True, kw_only=True)
class AnyCostFLConfig:
    """AnyCostFL (Li et al., INFOCOM 2023): the largest fitting rate, the channels with the largest L2 norm (one
    ordering per residual stream, so residual adds stay aligned)."""

    name: Literal["anycostfl"] = "anycostfl"
    rates: tuple[float, ...] = width_ratios(HETEROFL_RATES)
    label_mask: bool = False
    distill: DistillConfig = field(default_factory=DistillConfig)
