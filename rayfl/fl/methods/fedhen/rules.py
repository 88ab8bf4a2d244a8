"""What ``rayfl validate`` checks about FedHeN, NoSide and Decouple runs (paper 001): the simple model is the sub-model
that ends at the complex model's side exit (Assumption 2.1), so the model needs one. Imports neither torch nor Ray."""

from __future__ import annotations

from typing import Any

from rayfl.core.errors import KeyPath, Problem
from rayfl.fl.api.rules import RunView

__all__ = ["problems"]


def problems(run: RunView, at: KeyPath, algo: Any) -> list[Problem]:
    """The model has a side exit."""
    if getattr(run.model, "side_exit", 0) == 0:
        reason = f"algorithm {algo.name!r} needs a resnet model with a side exit (side_exit >= 1)"
        return [(("model", "side_exit"), reason)]
    return []
