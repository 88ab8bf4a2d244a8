"""A run under memory and bandwidth budgets: failures stay out of aggregation and reach the records and report."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.config.sections import ResourceConfig, SystemConfig
from rayfl.engine.build import build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.sampling import sample_clients
from rayfl.report import report
from tests.helpers import tiny_config, tiny_image_dataset
from tests.unit.system.test_clock import clock_for


def test_failed_clients_are_recorded_and_not_aggregated(tmp_path: Path) -> None:
    _, need, _ = clock_for(SystemConfig())
    mib = need / 2**20
    system = SystemConfig(
        memory=ResourceConfig(source="levels", values=(0.5 * mib, 2 * mib, 2 * mib, 2 * mib, 2 * mib)),
        bandwidth_down=ResourceConfig(source="uniform", low=0.05, high=0.5),
    )
    cfg = dataclasses.replace(tiny_config(kind="local"), system=system, rounds=3, output_dir=str(tmp_path))
    result = run_experiment(cfg, dataset=tiny_image_dataset())
    assert result.run_dir is not None
    clients = pd.read_parquet(result.run_dir / "clients.parquet")
    assert len(clients) == cfg.rounds * cfg.clients_per_round
    # levels: exactly one client in five cannot hold the model, every round
    assert (clients.groupby("round_idx")["failure"].apply(lambda f: (f == "memory").sum()) == 1).all()
    rounds = pd.read_csv(result.run_dir / "rounds.csv")
    assert (rounds["failed_memory"] == 1).all()
    assert (rounds["clients_run"] == cfg.clients_per_round - 1).all()
    assert (rounds["sim_duration_s"] > 0).all() and rounds["sim_time_s"].is_monotonic_increasing
    ok = clients[clients["failure"] == ""]
    np.testing.assert_allclose(ok["memory_util"], ok["memory_need_mib"] / ok["memory_budget_mib"])
    assert (ok["memory_util"] <= 1).all() and (ok["bandwidth_util"] <= 1).all()
    # a round's utilisation is the mean over the clients that ran
    np.testing.assert_allclose(rounds["memory_util"], ok.groupby("round_idx")["memory_util"].mean().to_numpy())
    np.testing.assert_allclose(rounds["bandwidth_util"], ok.groupby("round_idx")["bandwidth_util"].mean().to_numpy())
    # the round's duration is its slowest surviving client's download + compute + upload
    slowest = ok.assign(total=ok.download_s + ok.compute_s + ok.upload_s).groupby("round_idx")["total"].max()
    np.testing.assert_allclose(rounds["sim_duration_s"], slowest.to_numpy())
    markdown, pngs = report([result.run_dir])
    assert "simulated time, utilisation and failures per round" in markdown
    assert "accuracy_vs_sim_hours.png" in {p.name for p in pngs}


def test_the_failed_client_does_not_change_the_model(tmp_path: Path) -> None:
    """Same run with the failing client's data replaced: if it were aggregated the weights would differ."""
    _, need, _ = clock_for(SystemConfig())
    mib = need / 2**20
    system = SystemConfig(
        memory=ResourceConfig(source="levels", values=(0.5 * mib, 2 * mib, 2 * mib, 2 * mib, 2 * mib))
    )
    cfg = dataclasses.replace(tiny_config(kind="local"), system=system, rounds=1)
    first = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    setup = build_setup(cfg, tiny_image_dataset())
    clock = build_clock(cfg, setup)
    cohort = sample_clients(cfg.seed, 0, 12, cfg.clients_per_round)
    views = clock.check_in(0, cohort, [setup.dataset.num_examples(int(c)) for c in cohort])
    plan = clock.plan(0, views, setup.algorithm.assign(setup.algorithm.init_state(setup.params), 0, views))
    (loser,) = [int(c) for c, f in zip(plan.client_id, plan.failure, strict=True) if f == "memory"]
    other = tiny_image_dataset()
    start, end = other.offsets[loser], other.offsets[loser + 1]
    other.y[start:end] = (np.asarray(other.y[start:end]) + 1) % 4  # different labels for the failing client only
    second = run_experiment(cfg, write=False, dataset=other)
    for name, value in first.state.params.items():
        np.testing.assert_array_equal(value.numpy(), second.state.params[name].numpy())
    # control: without the memory budget the same client is aggregated and the changed labels show
    free = dataclasses.replace(cfg, system=SystemConfig())
    a = run_experiment(free, write=False, dataset=tiny_image_dataset()).state.params
    b = run_experiment(free, write=False, dataset=other).state.params
    assert any(not np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
