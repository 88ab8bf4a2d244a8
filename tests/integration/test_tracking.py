"""A written run's metrics in TensorBoard and MLflow (``rayfl/engine/persist/tracking.py``), read back with each
library's own reader: every round's accuracy, each global model's, the config as hyperparameters."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest

from rayfl.config.sections import TrackingConfig
from rayfl.core.errors import ConfigError
from rayfl.engine.driver import run_experiment
from rayfl.engine.persist import tracking
from rayfl.fl.methods.independent.config import IndependentConfig
from tests.helpers import tiny_config, tiny_image_dataset


def _run(tmp_path: Path, tracking: TrackingConfig) -> tuple[Path, list[dict[str, str]]]:
    cfg = dataclasses.replace(
        tiny_config(kind="local", num_hosts=1),
        algorithm=IndependentConfig(num_models=2),
        rounds=3,
        output_dir=str(tmp_path / "runs"),
        tracking=tracking,
    )
    result = run_experiment(cfg, dataset=tiny_image_dataset())
    assert result.run_dir is not None
    with (result.run_dir / "rounds.csv").open() as f:
        return result.run_dir, list(csv.DictReader(f))


def test_tensorboard_events_hold_every_rounds_accuracy(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, rows = _run(tmp_path, TrackingConfig(tensorboard=True))
    events = EventAccumulator(str(run_dir))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"test_acc", "train_loss", "bytes_up", "model_acc/0", "model_acc/1", "eval/model1/test_acc"} <= set(scalars)
    test_acc = events.Scalars("test_acc")
    assert [e.step for e in test_acc] == [0, 1, 2]
    assert [e.value for e in test_acc] == pytest.approx([float(r["test_acc"]) for r in rows], abs=1e-7)
    assert [e.value for e in events.Scalars("model_acc/0")] == [e.value for e in test_acc]
    assert events.Scalars("hparam/final_test_acc")[0].value == pytest.approx(float(rows[-1]["test_acc"]), abs=1e-7)


def test_an_mlflow_run_holds_every_rounds_accuracy_and_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run_dir, rows = _run(tmp_path, TrackingConfig(tensorboard=False, mlflow=True, mlflow_experiment="tests"))
    assert not list(run_dir.glob("events.out.tfevents.*"))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only so
    client = MlflowClient(tracking_uri=(tmp_path / "runs" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("tests")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == run_dir.name and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "test_acc")
    assert [(m.step, m.value) for m in history] == [(i, float(r["test_acc"])) for i, r in enumerate(rows)]
    assert len(client.get_metric_history(run.info.run_id, "model_acc/1")) == 3
    params = run.data.params
    assert params["algorithm.name"] == "independent" and params["rounds"] == "3"
    assert params["model.channels"] == "[8, 16]"


def test_a_tracker_without_its_package_is_one_config_error_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracking, "installed", lambda package: package != "mlflow")
    with pytest.raises(ConfigError, match=r"tracking.mlflow: the mlflow package is not installed \(pip install"):
        _run(tmp_path, TrackingConfig(mlflow=True))
    assert not (tmp_path / "runs").exists()
