"""Paper 002's baselines FLuID and SplitMix on Ray give the records and final state of the same run in-process, bit
for bit (the resume cases' tiny runs: memory budgets drawn per client, so FLuID has stragglers and SplitMix clients
train different numbers of bases)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rayfl.engine.driver import run_experiment
from tests.helpers import tiny_image_dataset
from tests.resume_cases import assert_same_run, case

BASELINES = ["fluid", "splitmix"]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("name", BASELINES)
def test_paper_002_baselines_on_ray_equal_in_process(name: str, tmp_path: Path) -> None:
    data = tiny_image_dataset()
    runs = []
    for kind in ("local", "ray"):
        cfg = dataclasses.replace(case(name, data, rounds=3), output_dir=str(tmp_path / kind))
        cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, kind=kind, cpus_per_host=0.25))
        runs.append(run_experiment(cfg, dataset=data))
    local, ray_run = runs
    assert local.run_dir is not None and ray_run.run_dir is not None
    assert_same_run(local.run_dir, ray_run.run_dir, local, ray_run)
