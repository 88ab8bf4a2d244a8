"""Resources the cluster can never grant (issue 26): Ray queues such an actor for ever, so ``rayfl run`` must stop
within ``backend.start_timeout_s`` with one line naming the key, what it asked and what the cluster has."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import ray

from rayfl.cli import main
from rayfl.config.sections import DataConfig
from rayfl.experiment.loader import dump_config
from tests.helpers import tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]


def _run_file(tmp_path: Path) -> Path:
    """A two-round Ray run of two 1-CPU hosts that waits 3 s for its actors, writing under ``tmp_path / "runs"``."""
    cfg = dataclasses.replace(
        tiny_config(kind="ray", num_hosts=2, cpus_per_host=1.0, start_timeout_s=3.0),
        rounds=2,
        data=DataConfig(name="synthetic", partition="iid", num_clients=8, synthetic_samples=16),
        output_dir=str(tmp_path / "runs"),
    )
    path = tmp_path / "run.yaml"
    dump_config(cfg, path)
    return path


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("backend.cpus_per_host=64", "64 CPU asked per client host, the largest node has 2"),
        ("backend.gpus_per_host=1", "1 GPU asked per client host, the largest node has 0"),
        ("backend.num_hosts=5", "5 CPU asked by 5 client hosts and 1 shards, the cluster has 2"),
    ],
)
def test_resources_the_cluster_cannot_grant_are_refused_in_one_line_naming_the_key(
    override: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _run_file(tmp_path)
    began = time.monotonic()
    assert main(["run", str(path), override]) == 2
    waited_s = time.monotonic() - began
    (line,) = capsys.readouterr().err.strip().splitlines()
    key = override.split("=")[0]
    assert line.startswith(f"rayfl: error: {path}: override '{override}': {key}: "), line
    assert named in line and "did not start within 3 s" in line and "ray.cluster_resources(): {CPU: 2" in line
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())  # no run directory
    assert waited_s < 60, f"refused after {waited_s:.0f} s"  # a hang, not a timing: it used to wait past 150 s
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2  # the actors that could start are given back


def test_a_reserved_head_with_no_other_node_is_refused_in_one_line_naming_backend_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _run_file(tmp_path)
    assert main(["run", str(path), "backend.head=reserved"]) == 2  # this session's Ray is one node: the head
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"rayfl: error: {path}: override 'backend.head=reserved': backend.head: "), line
    assert "did not start within 3 s" in line and "the cluster has no other node" in line, line
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
