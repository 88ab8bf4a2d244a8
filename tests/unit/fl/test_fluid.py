"""FLuID (Wang et al., NeurIPS 2023; paper 002's baseline): invariant units and the straggler's dropped units on
hand-made updates, a run without stragglers is FedAvg bit for bit, and a run with stragglers drops invariant units
(real in-process runs, nothing mocked)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from rayfl.config.sections import SystemConfig
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fluid.algorithm import FLuIDState
from rayfl.fl.methods.fluid.config import FLuIDConfig
from rayfl.fl.methods.fluid.invariant import invariant_units, relative_change, unit_changes, units_to_drop
from rayfl.models.elastic.space import Axis, Dimension, SearchSpace, TensorLayout
from tests.helpers import tiny_config, tiny_image_dataset
from tests.resume_cases import WALL_CLOCK_COLUMNS, assert_same_object, assert_same_run, case


def test_unit_changes_take_the_largest_relative_change_over_every_tensor_of_a_unit() -> None:
    # two dimensions: a (2 units) written by w's rows and b's vector, read by v's columns in groups of 2; c (3 units)
    space = SearchSpace(
        (Dimension("a", 2), Dimension("c", 3)),
        {
            "w": TensorLayout((2, 3), (Axis(0), Axis(1))),
            "b": TensorLayout((2,), (Axis(0),)),
            "v": TensorLayout((1, 4), (None, Axis(0, group=2))),
        },
    )
    before = {"w": torch.ones(2, 3), "b": torch.tensor([1.0, 0.0]), "v": torch.tensor([[2.0, 2.0, 2.0, 2.0]])}
    after = {
        "w": torch.tensor([[1.1, 1.0, 1.0], [1.0, 1.0, 1.3]]),
        "b": torch.tensor([1.0, 5.0]),  # a weight that was 0 is left out
        "v": torch.tensor([[2.0, 2.2, 2.0, 2.02]]),  # unit 0's columns change 10 %, unit 1's 1 %
    }
    a, c = unit_changes(space, before, after)
    np.testing.assert_allclose(a, [0.1, 0.3], rtol=1e-6)  # unit 0: max(10 % in w, 10 % in v); unit 1: 30 % in w
    np.testing.assert_allclose(c, [0.1, 0.0, 0.3], rtol=1e-6)  # w's columns
    assert float(relative_change(torch.tensor(0.0), torch.tensor(1.0))) == 0.0  # undefined: left out


def test_invariant_units_need_the_agreement_of_three_quarters_of_the_clients() -> None:
    changes = np.array(
        [  # four non-stragglers, five units
            [0.01, 0.20, 0.01, 0.05, 0.30],
            [0.01, 0.01, 0.02, 0.05, 0.30],
            [0.01, 0.01, 0.30, 0.06, 0.01],
            [0.02, 0.01, 0.01, 0.05, 0.30],
        ]
    )
    # at 0.05: unit 0 (4 of 4), unit 1 (3 of 4 = 75 %), unit 2 (3 of 4), unit 3 (3 of 4); unit 4 only 1 of 4
    assert invariant_units(changes, 0.05, 0.75).tolist() == [0, 1, 2, 3]
    assert invariant_units(changes, 0.05, 1.0).tolist() == [0]
    assert invariant_units(changes, 0.015, 0.75).tolist() == [0, 1]  # 3 of 4 each (0.02 and 0.20 above)
    assert invariant_units(changes, 0.009, 0.75).tolist() == []
    assert invariant_units(np.zeros((0, 5)), 0.05, 0.75).tolist() == []


def test_a_straggler_drops_still_invariant_units_first_then_invariant_then_any() -> None:
    rng = np.random.default_rng(0)
    # units 2 and 5 were dropped last round and are still invariant; 1 and 7 invariant; 4 dropped but no longer
    drop = units_to_drop(10, 2, invariant=[1, 2, 5, 7], dropped_before=[2, 4, 5], rng=rng)
    assert drop.tolist() == [2, 5]
    drop = units_to_drop(10, 3, [1, 2, 5, 7], [2, 4, 5], np.random.default_rng(0))
    assert set(drop.tolist()) - {2, 5} <= {1, 7} and len(drop) == 3
    drop = units_to_drop(10, 6, [1, 2, 5, 7], [2, 4, 5], np.random.default_rng(0))
    assert {1, 2, 5, 7} <= set(drop.tolist()) and len(set(drop.tolist())) == 6


def _run(tmp_path: Path, name: str, algorithm: object, system: SystemConfig | None = None) -> RunResult:
    cfg: ExperimentConfig = dataclasses.replace(
        tiny_config(kind="local", num_hosts=2), algorithm=algorithm, output_dir=str(tmp_path), name=name
    )
    if system is not None:
        cfg = dataclasses.replace(cfg, system=system)
    return run_experiment(cfg, dataset=tiny_image_dataset())


def test_fluid_without_stragglers_is_fedavg_bit_for_bit(tmp_path: Path) -> None:
    fedavg, fluid = _run(tmp_path, "fedavg", FedAvgConfig()), _run(tmp_path, "fluid", FLuIDConfig())
    assert fedavg.run_dir is not None and fluid.run_dir is not None
    state = fluid.state.algo_state
    assert isinstance(state, FLuIDState) and state.calibrations == 2 and not state.dropped  # no straggler ran
    records = [
        [{k: v for k, v in dataclasses.asdict(r).items() if k not in WALL_CLOCK_COLUMNS} for r in run.records]
        for run in (fedavg, fluid)
    ]
    assert_same_object(records[0], records[1], "records")
    paths = [fedavg.run_dir / "summary.json", fluid.run_dir / "summary.json"]
    summaries = [json.loads(path.read_text()) for path in paths]
    assert [summary.pop("algorithm") for summary in summaries] == ["fedavg", "fluid"]
    for path, summary in zip(paths, summaries, strict=True):
        path.write_text(json.dumps(summary))
    assert_same_run(fedavg.run_dir, fluid.run_dir)  # every table on disk
    assert fedavg.state.params.keys() == fluid.state.params.keys()
    for name, value in fedavg.state.params.items():
        assert torch.equal(value, fluid.state.params[name]), name


def test_stragglers_train_sub_models_and_the_server_finds_invariant_units() -> None:
    data = tiny_image_dataset()
    cfg = dataclasses.replace(case("fluid", data), rounds=4)  # memory budgets: some clients cannot train all of it
    result = run_experiment(cfg, write=False, dataset=data)
    state = result.state.algo_state
    assert isinstance(state, FLuIDState)
    assert state.calibrations == 2 and np.isfinite(state.threshold) and state.threshold >= 0.0
    assert any(state.drop_counts) and any(state.dropped)  # stragglers dropped units
    assert any(state.invariant)  # the threshold is the smallest change: at least that unit is invariant
