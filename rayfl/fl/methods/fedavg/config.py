"""FedAvg's configuration section (``algorithm.name: fedavg``). Imports neither torch nor Ray: the registry and ``rayfl
validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded, width_ratios

__all__ = ["FedAvgConfig"]


@dataclass(frozen=True, kw_only=True)
class FedAvgConfig:
    """FedAvg (McMahan et al., AISTATS 2017): one model everywhere, server step = SGD on the pseudo-gradient
    (``server.optimizer``, shared by every method; ``server_lr`` and ``server_momentum`` are FedAvg's alias of it).

    ``model``: ``full`` is the global model (paper 000's "Largest"); ``smallest`` is the smallest structure of the
    search space with ratios ``ratios`` (paper 000's "Smallest"), or with ``smallest_blocks`` the first blocks of each
    stage at the smallest positive ratio (a named smallest model such as ViT-tiny-tiny). ``budgets: ignore`` runs
    every sampled client even when its model exceeds a budget (the "Largest" upper bound), and records how often it
    would not have fit.
    """

    name: Literal["fedavg"] = "fedavg"
    weighting: Literal["samples", "uniform"] = "samples"  # client weight in the element-wise mean
    # FedAvg's own name for server.optimizer {name: sgd, lr}: 1.0 = plain averaging (set one of the two, not both)
    server_lr: float = bounded(1.0, gt=0.0)
    server_momentum: float = bounded(0.0, ge=0.0, lt=1.0)  # FedAvg's own name for server.optimizer.momentum (FedAvgM)
    model: Literal["full", "smallest"] = "full"
    ratios: tuple[float, ...] = width_ratios((0.0, 0.5, 1.0), zero_ok=True)
    # 'smallest': keep only the first blocks[s] blocks of each stage, every width at the smallest positive ratio (a
    # named smallest model, as model_search's algorithm.smallest: [1] is ViT-tiny-tiny); [] = the smallest structure
    # of ratios (skippable blocks removed when 0 is in ratios)
    smallest_blocks: tuple[int, ...] = ()
    budgets: Literal["enforce", "ignore"] = "enforce"
