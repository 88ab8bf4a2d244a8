"""A written run's metrics in the tools the field watches runs with: TensorBoard and MLflow (``tracking``).

Each evaluated or trained round, every numeric field of its record (``RoundRecord``: ``test_acc``, ``train_loss``,
``bytes_up``, ``sim_time_s`` ...), each global model's accuracy (``model_acc/<k>``) and each further evaluation of
``evals.csv`` (``eval/<name>/test_acc``, ``eval/<name>/test_loss``) are logged at step ``round_idx``; NaN fields (a
round without evaluation) are left out. At the end the resolved config goes in as hyperparameters (flattened to
``section.key``), with the summary's final figures as their metrics.

* TensorBoard (``tracking.tensorboard``; by default on when the ``tensorboard`` package is installed): event files in
  the run directory itself, written by torch's ``SummaryWriter``, so ``tensorboard --logdir runs/`` shows every run
  under its name.
* MLflow (``tracking.mlflow``): one MLflow run per rayfl run, named as its directory, in the experiment
  ``tracking.mlflow_experiment`` (default: the run's ``setting`` or ``rayfl``), through ``MlflowClient`` (no global
  active run) to ``tracking.mlflow_uri``, by default a file store ``mlruns/`` under ``output_dir`` (in the working
  directory when ``output_dir`` is a storage URI: a file store is a local folder). MLflow 3 keeps
  file stores in maintenance and refuses them unless ``MLFLOW_ALLOW_FILE_STORE=true``: the tracker allows it while
  it writes to one (a file store needs no database package; ``mlflow ui`` on it needs the variable set too).

Sweeps need nothing more: each trial is a written run, and logs so under its trial directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rayfl.core.files import is_storage_uri
from rayfl.engine.persist.records import EvalRecord, RoundRecord
from rayfl.experiment.schema import ExperimentConfig

__all__ = ["Trackers", "check_tracking", "flat_config", "open_trackers", "round_metrics"]

log = logging.getLogger(__name__)

Hparam = str | float | int | bool

_FINAL_KEYS = ("final_test_acc", "final_test_loss", "baseline_acc", "rounds", "wall_time_s", "sim_time_s")


class _Tracker(Protocol):
    def log_round(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self, params: Mapping[str, Hparam], final: Mapping[str, float], status: str) -> None: ...


def round_metrics(record: RoundRecord, evals: Sequence[EvalRecord]) -> dict[str, float]:
    """The round's figures by tag: its record's numeric fields, each model's accuracy, each further evaluation's."""
    metrics: dict[str, float] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name != "round_idx" and isinstance(value, int | float) and not isinstance(value, bool):
            metrics[f.name] = float(value)
    if record.model_accs:
        for k, acc in enumerate(record.model_accs.split()):
            metrics[f"model_acc/{k}"] = float(acc)
    for e in evals:
        metrics[f"eval/{e.name}/test_acc"] = float(e.test_acc)
        metrics[f"eval/{e.name}/test_loss"] = float(e.test_loss)
    return {k: v for k, v in metrics.items() if math.isfinite(v)}


def flat_config(cfg: ExperimentConfig) -> dict[str, Hparam]:
    """The resolved config as ``section.key`` hyperparameters (lists and mappings as their text)."""
    from rayfl.experiment.loader import config_to_dict

    def walk(prefix: str, value: Any) -> Iterator[tuple[str, Hparam]]:
        if isinstance(value, dict):
            for key, inner in value.items():
                yield from walk(f"{prefix}.{key}" if prefix else str(key), inner)
        elif isinstance(value, bool | int | float | str):
            yield prefix, value
        else:
            yield prefix, "" if value is None else str(value)

    return dict(walk("", config_to_dict(cfg)))


@dataclasses.dataclass
class Trackers:
    """The run's trackers; what fails in one is logged once and that tracker dropped, never the run stopped."""

    cfg: ExperimentConfig
    trackers: list[_Tracker]

    def log_round(self, record: RoundRecord, evals: Sequence[EvalRecord]) -> None:
        if not self.trackers:
            return
        metrics = round_metrics(record, evals)
        for tracker in list(self.trackers):
            self._guarded(tracker, "log", lambda t=tracker: t.log_round(record.round_idx, metrics))

    def close(self, summary: Mapping[str, object]) -> None:
        if not self.trackers:
            return
        params = flat_config(self.cfg)
        final = {k: float(v) for k in _FINAL_KEYS if isinstance(v := summary.get(k), int | float)}
        status = str(summary.get("status", ""))
        for tracker in list(self.trackers):
            self._guarded(tracker, "close", lambda t=tracker: t.close(params, final, status))
        self.trackers.clear()

    def _guarded(self, tracker: _Tracker, what: str, call: Any) -> None:
        try:
            call()
        except Exception:  # a tracker's fault (a full disk, an unreachable server) must not end the run
            log.exception("tracking: %s failed to %s; it is left out for the rest of the run", type(tracker), what)
            self.trackers.remove(tracker)


_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow"}  # the package each tracker needs, by config key


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def check_tracking(cfg: ExperimentConfig) -> None:
    """Before anything is written: a tracker asked for by name whose package is missing is a ``ConfigError``."""
    from rayfl.core.errors import ConfigError

    for key, package in _PACKAGES.items():
        if getattr(cfg.tracking, key) is True and not installed(package):
            raise ConfigError(
                f"the {package} package is not installed (pip install 'rayfl[track]', or set it to false)",
                f"tracking.{key}",
            )


def open_trackers(cfg: ExperimentConfig, run_dir: Path) -> Trackers:
    """The trackers ``cfg.tracking`` asks for, writing for the run in ``run_dir``."""
    wanted = cfg.tracking
    trackers: list[_Tracker] = []
    tensorboard = wanted.tensorboard
    if tensorboard is None:
        tensorboard = installed("tensorboard")
    if tensorboard:
        trackers.append(_TensorBoard(run_dir))
    if wanted.mlflow:
        trackers.append(_MLflow(cfg, run_dir))
    return Trackers(cfg, trackers)


class _TensorBoard:
    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ImportError(
                f"tracking.tensorboard needs the tensorboard package: pip install 'rayfl[track]' ({err})"
            ) from err
        self.run_dir = run_dir
        self.writer = SummaryWriter(log_dir=str(run_dir))

    def log_round(self, step: int, metrics: Mapping[str, float]) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self, params: Mapping[str, Hparam], final: Mapping[str, float], status: str) -> None:
        hparams = {**params, "status": status}
        # in the run's own directory, beside its scalars (torch's default is a sub-run named by the time)
        self.writer.add_hparams(hparams, {f"hparam/{k}": v for k, v in final.items()}, run_name=".")
        self.writer.close()


class _MLflow:
    def __init__(self, cfg: ExperimentConfig, run_dir: Path) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as err:
            raise ImportError(f"tracking.mlflow needs the mlflow package: pip install 'rayfl[track]' ({err})") from err
        # a file store is a local folder: with output_dir a storage URI, ``mlruns/`` in the working directory
        root = Path() if is_storage_uri(cfg.output_dir) else Path(cfg.output_dir)
        uri = cfg.tracking.mlflow_uri or (root.absolute() / "mlruns").as_uri()
        self.file_store = uri.startswith("file:") or "://" not in uri
        with self._allowed():
            self.client = MlflowClient(tracking_uri=uri)
            name = cfg.tracking.mlflow_experiment or cfg.setting or "rayfl"
            found = self.client.get_experiment_by_name(name)
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(name)
            tags = {"rayfl.run_dir": str(run_dir.absolute()), "rayfl.algorithm": cfg.algorithm_label}
            self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name, tags=tags).info.run_id
        log.info("tracking: MLflow run %s in experiment %r at %s", self.run_id, name, uri)

    def log_round(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with self._allowed():
            self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, params: Mapping[str, Hparam], final: Mapping[str, float], status: str) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        ended = {"finished": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED")
        with self._allowed():
            for start in range(0, len(items), 100):  # MLflow takes at most 100 parameters a batch
                self.client.log_batch(self.run_id, params=items[start : start + 100])
            self.client.set_terminated(self.run_id, ended)

    @contextlib.contextmanager
    def _allowed(self) -> Iterator[None]:
        """MLflow's file store allowed while this tracker writes to one (the module docstring)."""
        if not self.file_store or os.environ.get(_ALLOW_FILE_STORE):
            yield
            return
        os.environ[_ALLOW_FILE_STORE] = "true"
        try:
            yield
        finally:
            os.environ.pop(_ALLOW_FILE_STORE, None)


_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
