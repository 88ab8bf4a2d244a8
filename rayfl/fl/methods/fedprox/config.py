from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded

__all__ = ["FedProxConfig"]


@dataclass(frozen=True, kw_only=True)
class FedProxConfig:
    """FedProx (Li et al., MLSys 2020): FedAvg whose clients minimise ``f(w) + mu/2 ||w - w_global||^2``.

    ``mu``: the weight of the proximal term; 0 is FedAvg. The paper gives no single default: it tunes ``mu`` per data
    set over a small grid (0.001 to 1) and the best value differs between data sets. 0.01 sits inside that grid and
    keeps a run that does not set it close to FedAvg; tune it for the task.
    """

    name: Literal["fedprox"] = "fedprox"
    mu: float = bounded(0.01, ge=0.0)
