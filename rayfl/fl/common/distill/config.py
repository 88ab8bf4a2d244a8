"""The configuration of federated in-place distillation (paper 000, Sec. 3.3), shared by every method that can
distil on the server after aggregation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded

__all__ = ["DistillConfig"]


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """Federated in-place distillation (paper 000, Sec. 3.3, Algorithm 1), run on the server after aggregation.

    ``subnets`` sub-nets (n; 0 = the round's ``clients_per_round``, as the paper) are drawn uniformly from the search
    space (``ratios``, its S; empty: the method's own ratios or rates). Each of ``iterations`` (T_SKD) iterations gives
    every sub-net ``batch_size`` (K) fresh Gaussian inputs and a KL loss (``temperature``) against the global model's
    outputs. ``update``: ``shared`` (the paper's Eq. 2) runs the sub-nets on the global model's own weights and takes
    one Adam step (``lr``) on them with the sub-nets' gradients averaged per element over the sub-nets holding it, the
    teacher being the current global model; ``copies`` (rayfl's earlier variant, kept for comparison) trains a copy
    of each sub-net with its own Adam against the global model frozen at the round's start and then replaces every
    covered element by the copies' mean. ``optimizer_state`` (``shared`` only): ``round`` starts Adam afresh each
    round, ``run`` keeps its moments across rounds in ``ServerState.opt_state``. ``teacher`` (``shared`` only):
    ``step`` is the paper's ``W^{t-1}``, the global model before each step; ``round`` freezes it at the aggregated
    model for the whole round (an ablation: the teacher no longer moves with the weights it shares). ``optimizer``:
    ``adam`` (the paper's) or ``sgd`` (plain steps of ``lr`` times the gradient: an ablation, whose steps scale with
    the KD gradient where Adam's are about ``lr`` whatever its size).
    """

    enabled: bool = False
    subnets: int = bounded(0, ge=0)
    iterations: int = bounded(100, ge=0)
    batch_size: int = bounded(64, ge=1)
    lr: float = bounded(1e-3, gt=0.0)
    temperature: float = bounded(1.0, gt=0.0)
    ratios: tuple[float, ...] = ()
    update: Literal["shared", "copies"] = "shared"
    optimizer_state: Literal["round", "run"] = "round"
    teacher: Literal["step", "round"] = "step"
    optimizer: Literal["adam", "sgd"] = "adam"
