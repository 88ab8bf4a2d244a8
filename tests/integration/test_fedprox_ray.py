"""FedProx on Ray gives the records and final parameters of the same run in-process, bit for bit (the proximal term's
anchor is taken on whichever host trains the client, from the weights it received)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rayfl.engine.driver import RunResult, run_experiment
from rayfl.fl.methods.fedprox.config import FedProxConfig
from tests.helpers import tiny_config, tiny_image_dataset
from tests.resume_cases import assert_same_run


def _run(kind: str, out: Path) -> RunResult:
    cfg = tiny_config(kind=kind, num_hosts=2, num_shards=2, cpus_per_host=0.25)
    cfg = dataclasses.replace(cfg, algorithm=FedProxConfig(mu=0.1), output_dir=str(out), name="fedprox")
    return run_experiment(cfg, dataset=tiny_image_dataset())


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_fedprox_on_ray_equals_in_process(tmp_path: Path) -> None:
    local, ray_run = _run("local", tmp_path / "local"), _run("ray", tmp_path / "ray")
    assert local.run_dir is not None and ray_run.run_dir is not None
    assert local.records[-1].test_acc > 0.0
    assert_same_run(local.run_dir, ray_run.run_dir, local, ray_run)  # every table, summary.json, final state
