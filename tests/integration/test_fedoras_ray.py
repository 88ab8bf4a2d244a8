"""FedorAS's three-phase run (supernet training, search, per-tier fine-tuning) and its parallel search give the same
numbers in-process and on Ray."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rayfl.engine.driver import RunResult, run_experiment
from rayfl.fl.methods.fedoras.finetune import FinetuneState
from rayfl.fl.methods.fedoras.search import SearchState
from tests.helpers import tiny_image_dataset
from tests.helpers_fedoras import fedoras_tiny_config
from tests.resume_cases import assert_same_run

_KEYS = ("phase", "round_idx", "sim_time_s", "sim_duration_s", "train_loss", "test_acc", "test_loss", "bytes_down")


def _run(kind: str, hosts: int, phases: int = 3, out: Path | None = None) -> RunResult:
    cfg = fedoras_tiny_config(kind=kind, num_hosts=hosts, cpus_per_host=0.25)
    cfg = dataclasses.replace(cfg, phases=cfg.phases[:phases], rounds=sum(p.rounds for p in cfg.phases[:phases]))
    if out is not None:
        cfg = dataclasses.replace(cfg, output_dir=str(out))
    return run_experiment(cfg, write=out is not None, dataset=tiny_image_dataset())


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_three_phase_run_is_bit_identical_in_process_and_on_ray(tmp_path: Path) -> None:
    local, ray_run = _run("local", 2, out=tmp_path / "local"), _run("ray", 2, out=tmp_path / "ray")
    assert [tuple(getattr(r, k) for k in _KEYS) for r in local.records] == [
        tuple(getattr(r, k) for k in _KEYS) for r in ray_run.records
    ]
    assert {r.phase for r in ray_run.records} == {"supernet", "search", "finetune"}
    assert [r.model_accs for r in local.records] == [r.model_accs for r in ray_run.records]  # every tier's model
    assert isinstance(ray_run.state.algo_state, FinetuneState) and ray_run.state.models == local.state.models
    assert list(local.state.params) == list(ray_run.state.params)
    for name in local.state.params:
        assert torch.equal(local.state.params[name], ray_run.state.params[name]), name
    # the written records (rounds, clients, evals) and the report (summary.json with every phase's result: the
    # search's paths per tier, the tier models' accuracies) agree too, wall-clock columns aside
    assert local.run_dir is not None and ray_run.run_dir is not None
    assert_same_run(local.run_dir, ray_run.run_dir, local, ray_run)
    phases = json.loads((ray_run.run_dir / "summary.json").read_text())["phases"]
    assert [p["name"] for p in phases] == ["supernet", "search", "finetune"]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_search_gives_the_same_result_in_process_and_on_ray_tasks() -> None:
    local, ray_run = _run("local", 1, phases=2), _run("ray", 1, phases=2)
    a, b = local.state.algo_state, ray_run.state.algo_state
    assert isinstance(a, SearchState) and isinstance(b, SearchState)
    for x, y in zip(a.searches, b.searches, strict=True):
        assert np.array_equal(x.seen_paths, y.seen_paths)
        assert np.array_equal(x.seen_scores, y.seen_scores)
        assert np.array_equal(x.paths, y.paths)
