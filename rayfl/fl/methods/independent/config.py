"""The configuration section of several independent FedAvg models in one run (``algorithm.name: independent``). Imports
neither torch nor Ray: the registry and ``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded

__all__ = ["IndependentConfig"]


@dataclass(frozen=True, kw_only=True)
class IndependentConfig:
    """Several independent FedAvg models in one run (a multi-model baseline, e.g. FedHeN's "Decouple"): ``num_models``
    global models of the run's architecture, each initialised from its own seed; client ``c`` always trains model
    ``c mod num_models`` and is scored on it."""

    name: Literal["independent"] = "independent"
    num_models: int = bounded(2, ge=1)
    weighting: Literal["samples", "uniform"] = "samples"
