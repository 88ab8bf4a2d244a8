"""What ``rayfl validate`` checks about FedTrans runs (paper 002): FedTrans grows cells, so the model is a cell network.
Imports neither torch nor Ray."""

from __future__ import annotations

from typing import Any

from rayfl.config.model import CellNetConfig
from rayfl.core.errors import KeyPath, Problem
from rayfl.fl.api.rules import RunView

__all__ = ["problems"]


def problems(run: RunView, at: KeyPath, algo: Any) -> list[Problem]:
    """The model is a ``cellnet``."""
    if not isinstance(run.model, CellNetConfig):
        return [((*at, "name"), f"'fedtrans' transforms cells and needs model.name: cellnet, got {run.model.name!r}")]
    return []
