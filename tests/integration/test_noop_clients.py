"""``train.noop``: clients return the global weights untrained, so FedAvg's global model never moves, on either
backend, while every other engine step (sampling, scatter, reduce, records) runs as usual."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rayfl.config.sections import TrainConfig
from rayfl.engine.build import build_setup
from rayfl.engine.driver import run_experiment
from tests.helpers import tiny_config, tiny_image_dataset


@pytest.mark.parametrize("kind", ["local", pytest.param("ray", marks=[pytest.mark.ray])])
def test_noop_clients_leave_fedavg_global_weights_unchanged(kind: str, request: pytest.FixtureRequest) -> None:
    if kind == "ray":
        request.getfixturevalue("ray_local")
    base = tiny_config(kind=kind, num_hosts=2, num_shards=2, cpus_per_host=0.25)
    cfg = dataclasses.replace(base, train=dataclasses.replace(base.train, noop=True))
    initial = build_setup(cfg, dataset=tiny_image_dataset()).params
    result = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    assert [r.clients_run for r in result.records] == [cfg.clients_per_round] * cfg.rounds
    assert all(r.train_loss == 0.0 for r in result.records)
    for name, tensor in initial.items():
        assert torch.equal(result.state.params[name], tensor), name


def test_noop_defaults_off() -> None:
    assert TrainConfig().noop is False
