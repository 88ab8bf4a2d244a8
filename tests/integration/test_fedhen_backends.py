"""FedHeN runs are bit-identical in-process and on Ray (1 vs 3 hosts, 1 vs 2 shards), simple model included, and
so is the all-device model (``eval_all_devices``: every client's last upload, kept in its memory in the object store
and reduced on the hosts)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rayfl.engine.driver import RunResult, run_experiment
from tests.helpers import tiny_image_dataset
from tests.unit.fl.test_fedhen import NUM_CLIENTS, fedhen_config


def _run(kind: str, hosts: int, shards: int) -> RunResult:
    cfg = fedhen_config(kind=kind, num_hosts=hosts, num_shards=shards, cpus_per_host=0.25)
    cfg = dataclasses.replace(cfg, eval_all_devices=True)
    return run_experiment(cfg, write=False, dataset=tiny_image_dataset(NUM_CLIENTS))


def _assert_identical(a: RunResult, b: RunResult) -> None:
    keys = (
        "train_loss",
        "test_acc",
        "test_loss",
        "clients_run",
        "clients_failed",
        "bytes_down",
        "bytes_up",
        "device_acc",
        "all_devices_acc",
        "all_devices_loss",
        "all_devices_device_acc",
    )
    assert [tuple(getattr(r, k) for k in keys) for r in a.records] == [
        tuple(getattr(r, k) for k in keys) for r in b.records
    ]
    assert a.evals == b.evals
    for name in a.state.params:
        assert torch.equal(a.state.params[name], b.state.params[name]), name


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_fedhen_on_ray_equals_in_process() -> None:
    local = _run("local", 3, 2)
    assert {e.name for e in local.evals} == {"simple", "all_devices/simple"}
    assert all(math.isfinite(r.all_devices_acc) for r in local.records)
    _assert_identical(local, _run("ray", 3, 2))
    _assert_identical(local, _run("ray", 1, 1))
