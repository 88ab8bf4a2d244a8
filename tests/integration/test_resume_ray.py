"""Checkpoints on the Ray backend: client memories fetched from the object store into a checkpoint and put back
into it on resume; a run may be resumed on the other backend (records are the same on both)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from rayfl.engine.driver import run_experiment
from rayfl.experiment.schema import ExperimentConfig
from tests.helpers import tiny_image_dataset
from tests.resume_cases import assert_same_run, case, keep_checkpoints_up_to


def _on(cfg: ExperimentConfig, kind: str) -> ExperimentConfig:
    return dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, kind=kind, cpus_per_host=0.25))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize(
    ("name", "written_on", "resumed_on"),
    # memories out of and into the object store; paper 004's FjORD written on Ray, resumed in-process
    [("fedrescue", "ray", "local"), ("fedrescue", "local", "ray"), ("fjord004", "ray", "local")],
)
def test_resume_on_ray_equals_the_uninterrupted_run(
    name: str, written_on: str, resumed_on: str, tmp_path: Path
) -> None:
    data = tiny_image_dataset()
    cfg = dataclasses.replace(case(name, data), output_dir=str(tmp_path))
    full = run_experiment(_on(cfg, written_on), dataset=data)
    assert full.run_dir is not None
    copy = tmp_path / "resumed"
    shutil.copytree(full.run_dir, copy)
    keep_checkpoints_up_to(copy, 2)
    resumed = run_experiment(_on(cfg, resumed_on), dataset=data, resume=copy)
    assert_same_run(full.run_dir, copy, full, resumed)
