"""Search-only runs (paper 000, App. E.1): assignment and planning under budgets, round after round, no training."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rayfl.data.federated import FederatedDataset
from rayfl.engine.driver import run_experiment
from rayfl.engine.search_only import meta_params, run_search_only
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.anycostfl.config import AnyCostFLConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.fl.methods.model_search.algorithm import ModelSearchAlgorithm
from rayfl.fl.methods.model_search.config import ModelSearchConfig
from rayfl.models import InputSpec
from rayfl.report import load_run
from tests.unit.fl.test_model_search_algorithm import (
    RESNET,
    bound,
    budgets_between_smallest_and_largest,
    config,
)

ROUNDS = 6


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    from tests.helpers import tiny_image_dataset

    return tiny_image_dataset()


def search_config(data: FederatedDataset, epsilon: float, t_max: int = 5) -> ExperimentConfig:
    cfg = config(ModelSearchConfig(ratios=(0.0, 0.5, 1.0), epsilon=epsilon, t_max=t_max), model=RESNET)
    cfg = dataclasses.replace(cfg, rounds=ROUNDS)
    return dataclasses.replace(cfg, system=budgets_between_smallest_and_largest(cfg, data, headroom=1.5))


def _numbers(records: list) -> list[tuple[float, ...]]:  # type: ignore[type-arg]
    keys = ("sim_time_s", "memory_util", "bandwidth_util", "hit_rate", "distinct_structures", "clients_run")
    return [tuple(getattr(r, k) for k in keys) for r in records]


def test_rounds_record_utilisation_and_hit_rate_in_unit_range(data: FederatedDataset) -> None:
    result = run_search_only(search_config(data, epsilon=0.2), write=False, dataset=data)
    assert [r.round_idx for r in result.records] == list(range(ROUNDS))
    for r in result.records:
        assert r.clients_sampled == 5 and r.clients_run + r.clients_failed == 5
        assert 0.0 < r.memory_util <= 1.0 and 0.0 < r.bandwidth_util <= 1.0
        assert 0.0 <= r.hit_rate <= 1.0
        assert math.isfinite(r.search_s) and r.search_s >= 0.0
        assert math.isnan(r.test_acc) and math.isnan(r.train_loss)  # nothing was trained or evaluated
    distinct = [r.distinct_structures for r in result.records]
    assert distinct == sorted(distinct) and distinct[-1] > 2  # epsilon 0.2 explores beyond the pool's two
    assert any(r.hit_rate > 0 for r in result.records)


def test_epsilon_one_draws_nothing_so_hit_rate_is_zero_and_only_pool_members_are_assigned(
    data: FederatedDataset, tmp_path: Path
) -> None:
    cfg = dataclasses.replace(search_config(data, epsilon=1.0), output_dir=str(tmp_path))
    result = run_search_only(cfg, dataset=data)
    assert all(r.hit_rate == 0.0 and r.distinct_structures <= 2 for r in result.records)
    setup, _ = bound(cfg, data)
    search = setup.algorithm.search  # type: ignore[attr-defined]
    pool = {" ".join(str(u) for u in units) for units in (search.smallest, search.largest)}
    assert result.run_dir is not None
    clients = pd.read_csv(result.run_dir / "clients.csv", dtype={"units": str}, keep_default_na=False)
    assert len(clients) == ROUNDS * cfg.clients_per_round
    assert set(clients["units"]) <= pool and len(set(clients["units"])) == 2  # both ends are used


def test_same_seed_same_numbers_and_the_clock_advances_by_the_planned_rounds(
    data: FederatedDataset, tmp_path: Path
) -> None:
    cfg = dataclasses.replace(search_config(data, epsilon=0.4), output_dir=str(tmp_path))
    first = run_search_only(cfg, dataset=data)
    second = run_search_only(cfg, write=False, dataset=data)
    assert _numbers(first.records) == _numbers(second.records)
    other_seed = run_search_only(dataclasses.replace(cfg, seed=1), write=False, dataset=data)
    assert _numbers(other_seed.records) != _numbers(first.records)
    # each round lasts as long as its slowest client that fits: download + modelled compute + upload
    assert first.run_dir is not None
    clients = pd.read_csv(first.run_dir / "clients.csv", keep_default_na=False)
    ran = clients[clients["failure"] == ""]
    slowest = (ran.download_s + ran.compute_s + ran.upload_s).groupby(ran.round_idx).max()
    durations = [r.sim_duration_s for r in first.records]
    np.testing.assert_allclose(durations, slowest.to_numpy())
    np.testing.assert_allclose([r.sim_time_s for r in first.records], np.cumsum(durations))
    # the run directory is a normal one: rayfl report reads it
    run = load_run(first.run_dir)
    assert run.rounds_run == ROUNDS and run.final_test_acc is None and run.sim_time_s > 0


def test_the_global_model_is_never_materialised(data: FederatedDataset) -> None:
    cfg = search_config(data, epsilon=0.8)
    spec = InputSpec.of(data.input_kind, data.num_classes, data.x, data.meta)
    params = meta_params(cfg, spec)
    assert params and all(t.is_meta for t in params.values())
    setup, _ = bound(cfg, data)  # a trained-model set-up has the same tensor shapes
    assert {k: tuple(v.shape) for k, v in params.items()} == {k: tuple(v.shape) for k, v in setup.params.items()}
    assert isinstance(setup.algorithm, ModelSearchAlgorithm)


def test_other_sub_model_methods_run_and_weight_ranking_methods_say_why_they_cannot(data: FederatedDataset) -> None:
    base = search_config(data, epsilon=0.8)
    heterofl = run_search_only(dataclasses.replace(base, algorithm=HeteroFLConfig()), write=False, dataset=data)
    assert all(0.0 < r.memory_util <= 1.0 and math.isnan(r.hit_rate) for r in heterofl.records)
    with pytest.raises(ValueError, match="without weights"):
        run_search_only(dataclasses.replace(base, algorithm=AnyCostFLConfig()), write=False, dataset=data)


def test_a_search_only_round_plans_exactly_as_a_training_round(data: FederatedDataset, tmp_path: Path) -> None:
    """Search-only runs are built from the training round's steps (check-in, ``assign_with_state``, the clock's
    plan, the record builder), so with the clock's modelled server time both kinds of run see the same budgets, assign
    the same sub-models and plan the same transfers and compute, round after round: their ``clients.csv`` agree in
    every planned column (training's failures can only add to the plan's)."""
    cfg = dataclasses.replace(search_config(data, epsilon=0.4), rounds=2)  # round 1 plans after round 0's clock
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, noop=True))
    search = run_search_only(dataclasses.replace(cfg, output_dir=str(tmp_path / "search")), dataset=data)
    training = run_experiment(dataclasses.replace(cfg, output_dir=str(tmp_path / "train")), dataset=data)
    assert search.run_dir is not None and training.run_dir is not None
    planned = pd.read_csv(search.run_dir / "clients.csv", dtype={"units": str}, keep_default_na=False)
    trained = pd.read_csv(training.run_dir / "clients.csv", dtype={"units": str}, keep_default_na=False)
    columns = [c for c in planned.columns if c not in ("failure", "p_down", "p_up", "train_macs")]
    pd.testing.assert_frame_equal(planned[columns], trained[columns])
    assert (planned["failure"] == trained["failure"]).all()  # noop clients fail only where the plan says
    for s, t in zip(search.records, training.records, strict=True):
        assert (s.sim_time_s, s.memory_util, s.bandwidth_util, s.distinct_structures, s.clients_run) == (
            t.sim_time_s,
            t.memory_util,
            t.bandwidth_util,
            t.distinct_structures,
            t.clients_run,
        )
