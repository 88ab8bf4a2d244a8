"""SplitMix (Hong et al., ICLR 2022; paper 002's baseline): the budget-to-bases mapping on hand budgets, the bases a
round hands out (a round-robin first base, distinct others), one base is FedAvg of that base bit for bit, and the
ensemble's members are independent (real runs and real cost model, nothing mocked)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import cast

import numpy as np
import torch

from rayfl.config.model import CellNetConfig, EnsembleConfig
from rayfl.core.messages import ClientView, ServerState
from rayfl.engine.build import bind_algorithm, build_clock, build_setup
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.splitmix.algorithm import SplitMix, SplitMixState, bases_that_fit
from rayfl.fl.methods.splitmix.config import SplitMixConfig
from rayfl.models import InputSpec, build_model
from rayfl.models.ensemble import Ensemble
from tests.helpers import tiny_config, tiny_image_dataset
from tests.resume_cases import WALL_CLOCK_COLUMNS, assert_same_object

BASE = CellNetConfig(channels=(4, 8))
ENSEMBLE = EnsembleConfig(base=BASE, members=4, width=0.5)


def test_bases_that_fit_is_the_largest_fitting_count() -> None:
    fits = np.array(
        [
            [True, True, False, False],  # 2 bases fit
            [True, True, True, True],  # all 4
            [False, False, False, False],  # none: 1 (the clock fails it)
            [True, False, True, False],  # not monotone (cannot happen with real costs): still the largest, 3
        ]
    )
    assert bases_that_fit(fits).tolist() == [2, 4, 1, 3]


def _bound(cfg: ExperimentConfig) -> SplitMix:
    setup = build_setup(cfg, tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    return cast(SplitMix, setup.algorithm)


def test_hand_budgets_map_to_bases_through_the_clocks_cost_model() -> None:
    cfg = dataclasses.replace(tiny_config(kind="local"), model=ENSEMBLE, algorithm=SplitMixConfig())
    alg = _bound(cfg)
    cost = alg.cost
    memory = [float(cost.evaluate(np.array([[n]])).peak_memory[0]) for n in (1, 2, 3, 4)]
    assert memory == sorted(memory) and memory[0] < memory[3]  # n bases cost more than n - 1
    budgets = [memory[0] - 1.0, memory[0], (memory[1] + memory[2]) / 2, memory[2], memory[3] * 2]
    views = [ClientView(c, 20, b) for c, b in enumerate(budgets)]
    assert alg.bases(views) == {0: 1, 1: 1, 2: 2, 3: 3, 4: 4}
    params = {k: v.detach().clone() for k, v in build_model(ENSEMBLE, alg.server.input_spec).state_dict().items()}
    out, state = alg.assign_with_state(ServerState(params=params, algo_state=SplitMixState()), 0, views)
    chosen = {c: out[c].units for c in out}
    assert chosen == {0: (1,), 1: (1,), 2: (2,), 3: (3,), 4: (4,)}
    fs = state.algo_state
    assert isinstance(fs, SplitMixState) and fs.cycle == 1 and fs.cursor == 1  # 4 handed out, a new shuffle began
    firsts = []
    for c in range(5):
        index = out[c].slices["members.layers__c1__weight"].index[0]
        assert index is not None and len(set(index.tolist())) == len(index)  # distinct bases
        firsts.append(index.tolist())
    # clients 0 and 1 train one base each: the round-robin's first two, which differ
    assert firsts[0] != firsts[1] and firsts[4] == [0, 1, 2, 3]


def _run(tmp_path: Path, name: str, model: object, algorithm: object) -> RunResult:
    cfg: ExperimentConfig = dataclasses.replace(
        tiny_config(kind="local", num_hosts=2), model=model, algorithm=algorithm, output_dir=str(tmp_path), name=name
    )
    return run_experiment(cfg, dataset=tiny_image_dataset())


def test_one_base_is_fedavg_of_that_base_bit_for_bit(tmp_path: Path) -> None:
    one = EnsembleConfig(base=BASE, members=1, width=1.0)
    fedavg, splitmix = _run(tmp_path, "fedavg", BASE, FedAvgConfig()), _run(tmp_path, "splitmix", one, SplitMixConfig())
    assert fedavg.run_dir is not None and splitmix.run_dir is not None
    assert splitmix.records[-1].test_acc > 0.0
    records = [
        [{k: v for k, v in dataclasses.asdict(r).items() if k not in WALL_CLOCK_COLUMNS} for r in run.records]
        for run in (fedavg, splitmix)
    ]
    assert_same_object(records[0], records[1], "records")
    # the tensors are the base's, stacked along a member axis of length 1
    assert len(fedavg.state.params) == len(splitmix.state.params)
    for name, value in fedavg.state.params.items():
        stacked = splitmix.state.params["members." + name.replace(".", "__")]
        assert torch.equal(stacked[0], value), name


def test_an_ensemble_mixes_independent_members() -> None:
    spec = InputSpec("image", 4, (3, 8, 8))
    torch.manual_seed(0)
    model = build_model(ENSEMBLE, spec)
    assert isinstance(model, Ensemble) and model.count == 4
    x = torch.randn(3, 3, 8, 8)
    model.eval()
    logits = model.member_logits(x)
    assert torch.allclose(model(x), torch.stack(logits).mean(dim=0))
    model.train()
    loss = torch.nn.functional.cross_entropy(model.member_logits(x)[1], torch.tensor([0, 1, 2]))
    loss.backward()  # type: ignore[no-untyped-call]
    grad = model.members.get_parameter("layers__c1__weight").grad
    assert grad is not None and grad[1].abs().sum() > 0
    assert float(grad[[0, 2, 3]].abs().sum()) == 0.0  # member 1's loss reaches member 1 only
