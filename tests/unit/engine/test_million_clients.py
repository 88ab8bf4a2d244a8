"""A run over a million clients sets up without touching every client (issue 30): counted, not timed
(``benchmarks/scale.py --n 1000000`` gives the time)."""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

import numpy as np
import pytest

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
from rayfl.engine import steps
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.system.resources import Constant, ResourceSource, Unlimited
from tests.helpers import count_data_work

NUM_CLIENTS = 1_000_000


def test_a_million_clients_set_up_without_touching_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rounds of 10 clients out of 1,000,000 (each evaluated): the run makes the images and labels of the clients
    it trains and a bounded sample (the test set, the trivial baseline's first rows), and it makes as many Python and
    builtin calls as the same run over 1,000 clients, so no step loops over the population; it reads the budgets of
    the clients it samples and the pre-flight check's first chunk only (no compute speed of every client at bind
    time, a vectorised lookup the call count cannot see)."""
    made = count_data_work(monkeypatch)

    def counted(at: Any) -> Any:
        def counted_at(self: ResourceSource, clients: np.ndarray, t: float, round_idx: int) -> np.ndarray:
            made["budget lookups"] += len(clients)
            return at(self, clients, t, round_idx)

        return counted_at

    for source in (Unlimited, Constant):  # the run's budgets: unlimited, and a constant compute speed
        monkeypatch.setattr(source, "at", counted(source.at))
    _counted_run(1000, count=False)  # the cost model's cache filled (on a fresh machine), for the counted runs
    made.clear()
    small, calls_small = _counted_run(1000)
    lookups_small = made["budget lookups"]
    made.clear()
    result, calls = _counted_run(NUM_CLIENTS)
    assert len(result.records) == 2 and all(r.clients_run == 10 for r in result.records)
    # the 40 trained rows, the 1,000 test images, the baseline's 8,192 rows; never one per client
    assert made["labels"] <= 8192 + 10 * 2 * 2 * 4
    assert made["images"] <= 1000 + 8192 + 10 * 2 * 2 * 8
    # budgets (memory, bandwidth, compute, availability) of the sampled clients and of the pre-flight check's first
    # chunk, as many as over 1,000 clients: no client's compute speed read at bind time, no census of every client
    assert made["budget lookups"] == lookups_small < 10_000, (made, lookups_small)
    # the same run over 1,000 clients calls as many functions, give or take the sampler's few differences
    assert len(small.records) == 2 and abs(calls - calls_small) < 10_000, (calls, calls_small)


def _counted_run(num_clients: int, count: bool = True) -> tuple[RunResult, int]:
    """Two rounds of 10 clients out of ``num_clients``, each evaluated, and the Python and builtin calls they made."""
    cfg = ExperimentConfig(
        name="million",
        rounds=2,
        clients_per_round=10,
        eval_every=1,
        data=DataConfig(
            name="synthetic", partition="iid", num_clients=num_clients, synthetic_samples=2, synthetic_labels="image"
        ),
        model=CNNConfig(channels=(4, 8)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=2, lr=0.05),
        backend=BackendConfig(kind="local", num_hosts=2),
    )
    calls = [0]

    def counter(frame: FrameType, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            calls[0] += 1

    sys.setprofile(counter if count else None)
    try:
        result = run_experiment(cfg, write=False)
    finally:
        sys.setprofile(None)
    return result, calls[0]


def test_a_single_model_all_device_average_needs_no_census(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``eval_all_devices`` a single-model run's device averages (on the global and on the all-device model) are
    one evaluation's accuracy over every device: the records equal those of the census of every client, bit for bit,
    and the budgets of every client are not read again in each evaluated round."""
    lookups = Counter[str]()

    def counted(at: Any) -> Any:
        def counted_at(self: ResourceSource, clients: np.ndarray, t: float, round_idx: int) -> np.ndarray:
            lookups["budgets"] += len(clients)
            return at(self, clients, t, round_idx)

        return counted_at

    for source in (Unlimited, Constant):
        monkeypatch.setattr(source, "at", counted(source.at))
    fast = _all_devices_run()
    fast_lookups = lookups["budgets"]
    lookups.clear()
    monkeypatch.setattr(steps, "uniform_device_eval", lambda algorithm, state: None)  # the census, as before
    census = _all_devices_run()
    fields = ("test_acc", "device_acc", "all_devices_acc", "all_devices_loss", "all_devices_device_acc")
    for a, b in zip(fast.records, census.records, strict=True):
        assert all(getattr(a, f) == getattr(b, f) for f in fields), [(getattr(a, f), getattr(b, f)) for f in fields]
    assert not any(np.isnan(r.all_devices_device_acc) for r in fast.records)
    assert lookups["budgets"] - fast_lookups >= 2 * 400  # the census: every client's budgets in each evaluated round


def _all_devices_run() -> RunResult:
    cfg = ExperimentConfig(
        name="all-devices",
        rounds=2,
        clients_per_round=10,
        eval_every=1,
        eval_all_devices=True,
        data=DataConfig(name="synthetic", partition="iid", num_clients=400, synthetic_samples=2),
        model=CNNConfig(channels=(4, 8)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=2, lr=0.05),
        backend=BackendConfig(kind="local", num_hosts=2),
    )
    return run_experiment(cfg, write=False)
