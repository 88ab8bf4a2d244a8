"""FedRolex's configuration section (``algorithm.name: fedrolex``). Imports neither torch nor Ray: the registry and
``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfl.config.fields import bounded, width_ratios
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.common.widths import HETEROFL_RATES

__all__ = ["FedRolexConfig"]


@dataclass(frozen=True, kw_only=True)
class FedRolexConfig:
    """FedRolex (Alam et al., NeurIPS 2022): HeteroFL's rate choice with a rolling window of channels whose start
    moves by one unit per round; no static BN. ``official_init``: the official code's initial model (it builds its
    models with HeteroFL's ``init_param``: norm weight 1 and bias 0, linear biases 0). The official code's training
    set-up as defaults: ``grad_clip_norm`` and ``act`` as HeteroFL's (``HeteroFLConfig``)."""

    name: Literal["fedrolex"] = "fedrolex"
    rates: tuple[float, ...] = width_ratios(HETEROFL_RATES)
    label_mask: bool = True
    official_init: bool = True
    grad_clip_norm: float | None = bounded(1.0, ge=0.0)
    act: Literal["official", "model"] = "official"
    distill: DistillConfig = field(default_factory=DistillConfig)
