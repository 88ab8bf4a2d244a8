"""What ``rayfl validate`` checks about SplitMix runs: the model is an ensemble of base models. Imports neither torch
nor Ray."""

from __future__ import annotations

from typing import Any

from rayfl.config.model import EnsembleConfig
from rayfl.core.errors import KeyPath, Problem
from rayfl.fl.api.rules import RunView

__all__ = ["problems"]


def problems(run: RunView, at: KeyPath, algo: Any) -> list[Problem]:
    """The model is an ``ensemble``."""
    if not isinstance(run.model, EnsembleConfig):
        return [
            ((*at, "name"), f"'splitmix' trains base models and needs model.name: ensemble, got {run.model.name!r}")
        ]
    return []
