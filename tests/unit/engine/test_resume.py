"""Resumed ≡ uninterrupted, bit for bit, for every registered algorithm: a run resumed from a checkpoint writes the
same records (wall-clock columns aside) and ends with the same global state as the run that never stopped."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from rayfl.data.federated import FederatedDataset
from rayfl.engine.driver import run_experiment
from tests.helpers import tiny_image_dataset
from tests.resume_cases import assert_same_run, case, case_names, keep_checkpoints_up_to

# where the resumed copy starts: mid-run; the phased FedorAS run (supernet 2 rounds, search 3, supernet 2) once inside
# the search (its populations in the state) and once after it (its result, taken at the hand-over, in the checkpoint)
RESUME_AFTER = {"fedoras": 3, "fedoras_search": 6}


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return tiny_image_dataset()


@pytest.mark.parametrize("name", case_names())
def test_a_resumed_run_equals_the_uninterrupted_one(name: str, data: FederatedDataset, tmp_path: Path) -> None:
    cfg = dataclasses.replace(case(name, data), output_dir=str(tmp_path))
    full = run_experiment(cfg, dataset=data)
    assert full.run_dir is not None
    copy = tmp_path / "resumed"
    shutil.copytree(full.run_dir, copy)
    after = RESUME_AFTER.get(name, 2)
    keep_checkpoints_up_to(copy, after)
    resumed = run_experiment(cfg, dataset=data, resume=copy)
    assert [r.round_idx for r in resumed.records] == list(range(cfg.rounds))
    assert_same_run(full.run_dir, copy, full, resumed)
