"""``RunParts``: the fixed parts of a run, built once before its first round and handed to the round policy."""

from __future__ import annotations

from dataclasses import dataclass

from rayfl.data.federated import FederatedDataset
from rayfl.engine.exec.backend import Backend
from rayfl.engine.phases import PhaseSchedule
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.tasks import TaskPool
from rayfl.models.inputs import InputSpec
from rayfl.system.clock import SimClock

__all__ = ["RunParts"]


@dataclass(frozen=True)
class RunParts:
    """The run's fixed parts, built once before its first round."""

    cfg: ExperimentConfig
    dataset: FederatedDataset
    clock: SimClock
    backend: Backend
    schedule: PhaseSchedule
    pool: TaskPool
    start: float  # ``time.perf_counter()`` when the run began (its records' wall time counts from it)
    startup_s: dict[str, float]
    input_spec: InputSpec
