"""Asynchronous rounds are the same numbers on every backend: in-process vs Ray with 1 and 3 client hosts (FedBuff on
sub-models with unstable links and per-client memories), and a run stopped by a real SIGINT between server steps, its
clients in flight, resumes to exactly the run that never stopped."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import pandas as pd
import pytest

from rayfl.config.sections import BackendConfig, CheckpointConfig, ServerConfig
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.loader import dump_config
from rayfl.experiment.schema import ExperimentConfig
from tests.helpers import tiny_image_dataset
from tests.integration.test_interrupt import _run_cli
from tests.resume_cases import WALL_CLOCK_COLUMNS, assert_records_agree, assert_same_run, assert_same_state, case

FEDBUFF = ServerConfig(policy="fedbuff", concurrency=5, buffer_size=2)


def _nested_with_links(backend: BackendConfig, rounds: int = 4) -> ExperimentConfig:
    """FedResCuE (nested sub-models) with budgets drawn per client and round and unstable links that pad from each
    client's own memory."""
    cfg = case("fedrescue", None, rounds=rounds)
    return dataclasses.replace(cfg, backend=backend, server=FEDBUFF, checkpoint=CheckpointConfig(every=0))


def _records(result: RunResult) -> pd.DataFrame:
    frame = pd.DataFrame([dataclasses.asdict(r) for r in result.records])
    return frame.drop(columns=[c for c in WALL_CLOCK_COLUMNS if c in frame.columns])


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_fedbuff_on_ray_with_one_and_three_hosts_equals_in_process() -> None:
    data = tiny_image_dataset()
    local = run_experiment(_nested_with_links(BackendConfig(kind="local", num_hosts=2)), write=False, dataset=data)
    assert max(r.staleness_max for r in local.records) >= 1
    for hosts in (1, 3):
        backend = BackendConfig(kind="ray", num_hosts=hosts, num_shards=2, cpus_per_host=0.25)
        ray_run = run_experiment(_nested_with_links(backend), write=False, dataset=data)
        pd.testing.assert_frame_equal(_records(local), _records(ray_run), check_exact=True)
        assert_same_state(local.state.params, ray_run.state.params)


@pytest.mark.slow
def test_sigint_between_steps_then_resume_equals_the_uninterrupted_fedbuff_run(tmp_path: Path) -> None:
    cfg = dataclasses.replace(
        case("heterofl", None, rounds=6),
        name="fedbuff",
        output_dir=str(tmp_path / "runs"),
        server=FEDBUFF,
        checkpoint=CheckpointConfig(every=3),
    )
    path = tmp_path / "fedbuff.yaml"
    dump_config(cfg, path)
    code, out, err = _run_cli(["run", str(path)], [signal.SIGINT], at_round=0)
    assert code == 130, out + err
    run_dir = Path(cfg.output_dir) / "fedbuff"
    summary = assert_records_agree(run_dir)
    assert summary["status"] == "interrupted" and 1 <= summary["rounds"] < cfg.rounds
    resumed = run_experiment(cfg, resume=run_dir)
    whole = run_experiment(dataclasses.replace(cfg, name="fedbuff-whole"))
    assert whole.run_dir is not None
    assert any(r.in_flight > 0 for r in whole.records[: summary["rounds"]])  # clients were in flight at the stop
    assert_same_run(whole.run_dir, run_dir, whole, resumed)
