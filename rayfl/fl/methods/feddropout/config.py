"""Federated Dropout's configuration section (``algorithm.name: feddropout``). Imports neither torch nor Ray: the
registry and ``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfl.config.fields import width_ratios
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.common.widths import HETEROFL_RATES

__all__ = ["FedDropoutConfig"]


@dataclass(frozen=True, kw_only=True)
class FedDropoutConfig:
    """Federated Dropout (Caldas et al., 2018): the largest fitting rate, channels drawn at random (per client and
    round with ``per_client``, else one draw per round shared by every client), residual streams kept aligned."""

    name: Literal["feddropout"] = "feddropout"
    rates: tuple[float, ...] = width_ratios(HETEROFL_RATES)
    per_client: bool = True
    label_mask: bool = False
    distill: DistillConfig = field(default_factory=DistillConfig)
