"""What a method's own validation rules receive: a read-only view of the run's sections.

A method that has rules of its own (FedorAS's phase order, FedHeN's side exit, FedTrans's cell network) names a
function ``problems(run, at, section) -> list[Problem]`` in its registry row; the experiment's generic rules
(``rayfl/experiment/rules.py``) call it once per algorithm section of the config (``at`` is ``("algorithm",)`` or
``("phases", i, "algorithm")``). ``RunView`` is a structural type that ``ExperimentConfig`` satisfies, so methods
read the run's sections without importing the experiment layer above them. Imports neither torch nor Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rayfl.config.model import ModelConfig
from rayfl.config.sections import DataConfig, ServerConfig, SystemConfig, TrainConfig
from rayfl.core.errors import KeyPath, Problem

__all__ = ["MethodRules", "PhaseView", "RunView"]


class PhaseView(Protocol):
    """One phase of a run: its method's config section and its rounds."""

    @property
    def algorithm(self) -> Any: ...

    @property
    def rounds(self) -> int: ...


class RunView(Protocol):
    """The sections of a run a method's rules may read."""

    @property
    def model(self) -> ModelConfig: ...

    @property
    def data(self) -> DataConfig: ...

    @property
    def system(self) -> SystemConfig: ...

    @property
    def train(self) -> TrainConfig: ...

    @property
    def server(self) -> ServerConfig: ...

    @property
    def algorithm(self) -> Any: ...

    @property
    def phases(self) -> Sequence[PhaseView]: ...


MethodRules = Callable[[RunView, KeyPath, Any], list[Problem]]
