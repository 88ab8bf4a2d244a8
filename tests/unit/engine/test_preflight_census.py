"""The pre-flight check that someone can train (``engine/preflight.py``) looks at one round start when no budget
changes over time, sixteen otherwise (issue 30: refusing a run of a million clients looked at 16 x N budgets)."""

from __future__ import annotations

import numpy as np
import pytest

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, DataConfig, ResourceConfig, SystemConfig, TrainConfig
from rayfl.engine import preflight
from rayfl.engine.build import build_clock, build_setup
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.system.clock import SimClock


def _config(memory: ResourceConfig, num_clients: int = 1600) -> ExperimentConfig:
    return ExperimentConfig(
        name="preflight",
        rounds=40,
        clients_per_round=10,
        data=DataConfig(name="synthetic", partition="iid", num_clients=num_clients, synthetic_samples=8),
        model=CNNConfig(channels=(4, 8)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=8, lr=0.05),
        backend=BackendConfig(kind="local", num_hosts=1),
        system=SystemConfig(memory=memory),
    )


@pytest.mark.parametrize(
    ("memory", "invariant", "round_starts"),
    [
        (ResourceConfig(source="constant", low=0.1), True, 1),
        (ResourceConfig(source="uniform", low=0.1, high=0.2, per_round=False), True, 1),
        (ResourceConfig(source="uniform", low=0.1, high=0.2, per_round=True), False, 16),
    ],
)
def test_a_refusal_looks_at_every_client_once_per_round_start_that_can_differ(
    monkeypatch: pytest.MonkeyPatch, memory: ResourceConfig, invariant: bool, round_starts: int
) -> None:
    """A budget (0.1-0.2 MiB) nobody's model fits: the refusal checks in each of 1,600 clients once when every source is
    time-invariant (constant, or drawn once per client), at 16 round starts when memory is drawn per round; the
    chunks it plans grow, so fewer plans than 1,600 / 512 per round start."""
    cfg = _config(memory)
    setup = build_setup(cfg)
    clock = build_clock(cfg, setup)
    seen: list[int] = []
    plans: list[int] = []
    check_in, plan = SimClock.check_in, SimClock.plan

    def counted_check_in(self: SimClock, round_idx: int, clients: np.ndarray, *args: object, **kw: object) -> object:
        seen.append(len(clients))
        return check_in(self, round_idx, clients, *args, **kw)  # type: ignore[arg-type]

    def counted_plan(self: SimClock, *args: object, **kw: object) -> object:
        plans.append(1)
        return plan(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(SimClock, "check_in", counted_check_in)
    monkeypatch.setattr(SimClock, "plan", counted_plan)
    assert preflight.budgets_time_invariant(clock) is invariant
    reason = preflight.nobody_can_train_problem(cfg, setup, clock)
    assert reason.startswith("no client can ever train") and "memory" in reason
    assert sum(seen) == round_starts * 1600
    assert len(plans) == round_starts * 3  # 512 + 1,024 + the other 64 clients


def test_someone_who_fits_still_stops_the_check_at_its_first_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """With budgets some client fits (the default: unlimited) the check reads its first 512 clients only."""
    cfg = _config(ResourceConfig(source="none"))
    setup = build_setup(cfg)
    clock = build_clock(cfg, setup)
    seen: list[int] = []
    check_in = SimClock.check_in

    def counted_check_in(self: SimClock, round_idx: int, clients: np.ndarray, *args: object, **kw: object) -> object:
        seen.append(len(clients))
        return check_in(self, round_idx, clients, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(SimClock, "check_in", counted_check_in)
    assert preflight.nobody_can_train_problem(cfg, setup, clock) == ""
    assert seen == [512]
