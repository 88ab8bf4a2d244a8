"""What a trial reports each round: accuracy and loss carried between evaluations."""

from __future__ import annotations

import dataclasses
import math

import pytest

from rayfl.engine.persist.records import RoundRecord
from rayfl.tune.metrics import REPORTED_METRICS, RoundMetrics


def record(round_idx: int, acc: float, loss: float) -> RoundRecord:
    return RoundRecord(
        round_idx=round_idx,
        sim_time_s=10.0 * (round_idx + 1),
        train_loss=1.0,
        test_acc=acc,
        test_loss=loss,
        clients_run=3,
        clients_failed=1,
        bytes_down=0,
        bytes_up=0,
        wall_time_s=0.0,
        round_wall_s=0.0,
        train_wall_s=0.0,
        eval_wall_s=0.0,
        lr=0.1,
        memory_util=0.5,
        hit_rate=0.25,
    )


def test_accuracy_and_loss_are_carried_until_the_next_evaluation() -> None:
    metrics = RoundMetrics()
    first = metrics(record(0, math.nan, math.nan))
    assert math.isnan(first["test_acc"]) and first["evaluated"] is False
    second = metrics(record(1, 0.4, 2.0))
    third = metrics(record(2, math.nan, math.nan))
    assert (second["test_acc"], second["test_loss"], second["evaluated"]) == (0.4, 2.0, True)
    assert (third["test_acc"], third["test_loss"], third["evaluated"]) == (0.4, 2.0, False)
    assert third["sim_time_s"] == 30.0 and third["rounds_done"] == 3
    assert (third["clients_run"], third["clients_failed"], third["memory_util"], third["hit_rate"]) == (3, 1, 0.5, 0.25)
    fourth = metrics(dataclasses.replace(record(3, math.nan, math.nan), faults=2, rolled_back=1))
    assert (third["faults"], third["rolled_back"], fourth["faults"], fourth["rolled_back"]) == (0, 0, 2, 1)
    assert set(third) == set(REPORTED_METRICS)


def test_client_accuracy_is_carried_and_training_macs_add_up() -> None:
    metrics = RoundMetrics()
    base = record(0, math.nan, math.nan)
    first = metrics(dataclasses.replace(base, train_macs=2e9, num_models=1))
    second = metrics(dataclasses.replace(base, round_idx=1, client_acc=0.6, train_macs=3e9, num_models=2))
    third = metrics(dataclasses.replace(base, round_idx=2, train_macs=1e9, num_models=2))
    assert math.isnan(first["client_acc"]) and first["train_gmacs"] == 2.0
    assert (second["client_acc"], second["train_gmacs"], second["num_models"]) == (0.6, 5.0, 2)
    assert (third["client_acc"], third["train_gmacs"]) == (0.6, 6.0)


def test_a_resumed_trial_carries_on_from_the_rounds_before_its_checkpoint() -> None:
    """A fresh ``RoundMetrics`` that replays the rounds before the checkpoint reports the next rounds exactly as the
    uninterrupted one does (accuracy, loss, client accuracy, MACs so far)."""
    base = record(0, math.nan, math.nan)
    rounds = [
        dataclasses.replace(base, round_idx=0, test_acc=0.3, test_loss=1.5, client_acc=0.2, train_macs=2e9),
        dataclasses.replace(base, round_idx=1, train_macs=3e9),
        dataclasses.replace(base, round_idx=2, train_macs=1e9),
    ]
    whole = RoundMetrics()
    want = [whole(r) for r in rounds]
    resumed = RoundMetrics()
    resumed.replay(rounds[:1])
    got = [resumed(r) for r in rounds[1:]]
    assert got == want[1:]
    assert got[-1]["train_gmacs"] == 6.0 and got[-1]["test_acc"] == 0.3 and got[-1]["client_acc"] == 0.2


def test_running_figures_for_a_table_built_from_the_last_report() -> None:
    metrics = RoundMetrics()
    base = record(0, math.nan, math.nan)
    rows = [
        dataclasses.replace(base, clients_sampled=4, bytes_down=1_000_000, bytes_up=500_000),
        dataclasses.replace(base, round_idx=1, test_acc=0.6, memory_util=0.3, hit_rate=math.nan),
        dataclasses.replace(record(2, 0.5, 1.0), clients_sampled=4, client_acc=0.7),
    ]
    last = [metrics(r) for r in rows][-1]
    assert last["best_test_acc"] == 0.6 and last["mean_memory_util"] == pytest.approx((0.5 + 0.3 + 0.5) / 3)
    assert last["mean_hit_rate"] == 0.25  # NaN rounds left out, as the table's means do
    assert (last["total_clients_failed"], last["total_clients_sampled"], last["total_network_mb"]) == (3, 8, 1.5)
    assert last["client_evaluated"] is True and last["evaluated"] is True
    resumed = RoundMetrics()
    resumed.replay(rows)
    again = resumed(record(3, math.nan, math.nan))
    assert again["best_test_acc"] == 0.6 and again["total_clients_failed"] == 4
    assert again["client_evaluated"] is False
