"""In-place distillation gives the same numbers in-process and on Ray: the default (Algorithm 1's trained copies)
and the Eq. 2 ablation on the shared weights with its optimizer state kept across rounds, which lives in
``ServerState.opt_state``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rayfl.config.sections import BackendConfig
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.common.distill.server import OPT_KEYS
from rayfl.fl.methods.model_search.config import ModelSearchConfig
from tests.helpers import tiny_config, tiny_image_dataset
from tests.unit.fl.test_model_search_algorithm import RESNET

DISTILL = DistillConfig(enabled=True, iterations=2, batch_size=8, update="shared", optimizer_state="run")


def _config(algorithm: object, kind: str, hosts: int, shards: int) -> ExperimentConfig:
    backend = BackendConfig(kind=kind, num_hosts=hosts, num_shards=shards, cpus_per_host=0.25)  # type: ignore[arg-type]
    return dataclasses.replace(tiny_config(), model=RESNET, rounds=2, algorithm=algorithm, backend=backend)  # type: ignore[arg-type]


def _assert_identical(a: RunResult, b: RunResult) -> None:
    keys = ("train_loss", "test_acc", "test_loss", "clients_run", "bytes_down", "bytes_up")
    assert [tuple(getattr(r, k) for k in keys) for r in a.records] == [
        tuple(getattr(r, k) for k in keys) for r in b.records
    ]
    for name in a.state.params:
        assert torch.equal(a.state.params[name], b.state.params[name]), name
    assert a.state.opt_state.keys() == b.state.opt_state.keys()
    for name in a.state.opt_state:
        assert torch.equal(a.state.opt_state[name], b.state.opt_state[name]), name


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_distillation_on_ray_equals_in_process_and_keeps_its_adam_in_server_state() -> None:
    data = tiny_image_dataset()
    algorithm = ModelSearchConfig(ratios=(0.0, 0.5, 1.0), distill=DISTILL)
    local = run_experiment(_config(algorithm, "local", 2, 1), write=False, dataset=data)
    steps = local.state.opt_state["distill/steps"]
    assert set(local.state.opt_state) == set(OPT_KEYS)
    assert float(steps.max()) == 2 * DISTILL.iterations  # two rounds of steps on the elements both rounds covered
    _assert_identical(local, run_experiment(_config(algorithm, "ray", 2, 2), write=False, dataset=data))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_the_default_distillation_on_ray_equals_in_process() -> None:
    data = tiny_image_dataset()
    distill = DistillConfig(enabled=True, iterations=2, batch_size=8)
    assert distill.update == "copies"
    algorithm = ModelSearchConfig(ratios=(0.0, 0.5, 1.0), distill=distill)
    local = run_experiment(_config(algorithm, "local", 2, 1), write=False, dataset=data)
    assert local.state.opt_state == {}  # each copy's Adam lives for its round only
    _assert_identical(local, run_experiment(_config(algorithm, "ray", 2, 2), write=False, dataset=data))
