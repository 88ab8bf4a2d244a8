"""The configuration sections of FedHeN and its baselines NoSide and Decouple (paper 001). Imports neither torch nor
Ray: the registry and ``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DecoupleConfig", "FedHeNConfig", "NoSideConfig"]


@dataclass(frozen=True, kw_only=True)
class FedHeNConfig:
    """FedHeN (Acar & Saligrama, ICML-W 2022; paper 001): simple devices train the side-exit sub-model, complex
    devices the whole model with the side objective (the side exit's loss added on the same batch); the simple part is
    the unweighted mean over all active devices, the rest over the active complex devices. A client is complex when
    the complex model fits its budgets (``system.memory`` levels fixed by client id give the paper's split)."""

    name: Literal["fedhen"] = "fedhen"


@dataclass(frozen=True, kw_only=True)
class NoSideConfig:
    """NoSide (paper 001, Algorithm 4): FedHeN's assignment and aggregation without the side objective (HeteroFL's
    aggregation with the simple model as the complex model's early-exit sub-network)."""

    name: Literal["noside"] = "noside"


@dataclass(frozen=True, kw_only=True)
class DecoupleConfig:
    """Decouple (paper 001, Algorithm 3): two independent FedAvgs in one run, the simple model (the run's ResNet
    ending at its side exit, ``model.exit_only``) over the simple devices and the complex model over the complex ones;
    devices are typed as in FedHeN (complex when the complex model fits their budgets)."""

    name: Literal["decouple"] = "decouple"
