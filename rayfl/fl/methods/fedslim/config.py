"""FedSlim's configuration section (paper 004's baseline, ``algorithm.name: fedslim``). Imports neither torch nor Ray:
the registry and ``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded, width_ratios
from rayfl.fl.common.widths import CAPACITIES, COLUMN_RATIOS

__all__ = ["FedSlimConfig"]


@dataclass(frozen=True, kw_only=True)
class FedSlimConfig:
    """FedSlim (paper 004's baseline, Algorithm 3): per batch, ``num_ratios`` ordered ratios of ``ratios`` (ending
    at the client's capacity); the client's whole model takes cross-entropy and every smaller width KL(the whole
    model's detached output || its own) (in-place distillation, as the paper's "learns prunable submodels purely by
    knowledge distillation"), all gradients summed into one step; sample-weighted element-wise mean (FedAvg).
    ``kd: false`` gives the smaller widths cross-entropy instead (Yu et al. 2018's slimmable training)."""

    name: Literal["fedslim"] = "fedslim"
    capacities: tuple[float, ...] = CAPACITIES
    ratios: tuple[float, ...] = width_ratios(COLUMN_RATIOS, zero_ok=True)
    num_ratios: int = bounded(4, ge=1)
    kd: bool = True
