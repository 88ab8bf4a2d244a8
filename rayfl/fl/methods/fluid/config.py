"""FLuID's configuration section (``algorithm.name: fluid``). Imports neither torch nor Ray: the registry and
``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded, width_ratios

__all__ = ["FLUID_RATES", "FLuIDConfig"]

# the sub-model sizes the authors' code gives a straggler (by how much slower it is than the next-slowest client)
FLUID_RATES = (0.95, 0.85, 0.75, 0.65, 0.5)


@dataclass(frozen=True, kw_only=True)
class FLuIDConfig:
    """FLuID (Wang, Nair, Mahajan, NeurIPS 2023): stragglers train sub-models without the neurons whose updates the
    non-stragglers found invariant (``rayfl/fl/methods/fluid/algorithm.py``).

    A client is a straggler when the whole model does not fit its round's budgets (``system.compute_limit_s`` is the
    round's deadline); it trains the largest of ``rates`` that fits. A unit (channel or neuron) is invariant when its
    largest relative weight change ``|w' - w| / |w|`` is at most the threshold for at least ``agreement`` of the
    round's non-stragglers. ``threshold``: fixed when positive; 0 calibrates it as the authors' code (the smallest
    per-unit change of the first dimension in the first round with non-stragglers, averaged with the second's), then
    raises it by ``increment`` every ``increment_every`` rounds after ``increment_after`` x the run's rounds, until
    every dimension has as many invariant units as the stragglers drop.
    """

    name: Literal["fluid"] = "fluid"
    rates: tuple[float, ...] = width_ratios(FLUID_RATES)
    threshold: float = bounded(0.0, ge=0.0)
    agreement: float = bounded(0.75, gt=0.0, le=1.0)
    increment: float = bounded(0.01, ge=0.0)
    increment_every: int = bounded(10, ge=1)
    increment_after: float = bounded(0.5, ge=0.0, le=1.0)
