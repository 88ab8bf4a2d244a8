"""The experiment: one frozen dataclass tree that a YAML file fills, binding a model, data, a simulated system and
a method (or several phases of methods). It sits above ``rayfl.fl`` because it is the one object that names a method:
its ``algorithm`` section is tagged by name through the method registry (``rayfl/fl/registry.py``).

``rayfl.experiment.loader`` turns a file (plus ``a.b=c`` overrides) into an ``ExperimentConfig``. Importing this module
imports neither torch nor Ray, so ``rayfl validate`` is instant."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, cast

from rayfl.config.fields import bounded
from rayfl.config.model import MODEL_CONFIGS, CharLSTMConfig, ModelConfig
from rayfl.config.sections import (
    BackendConfig,
    CheckpointConfig,
    CompressionConfig,
    DataConfig,
    ExportConfig,
    ServerConfig,
    SystemConfig,
    TrackingConfig,
    TrainConfig,
)
from rayfl.fl.registry import ALGORITHM_CONFIGS, AlgorithmConfig, default_algorithm_config

__all__ = ["ExperimentConfig", "PhaseConfig", "method_activations", "official_activation"]


# ---------------------------------------------------------------------------------------------- experiment
@dataclass(frozen=True, kw_only=True)
class PhaseConfig:
    """One phase of a multi-phase run (``rayfl/engine/phases.py``): its own algorithm for ``rounds`` rounds, and
    optionally its own clients per round, client learning rate and local epochs (FedorAS trains its supernet and
    fine-tunes with different figures, paper 003 Tab. 7-8); the learning-rate schedule runs over the phase's own
    rounds, and the clock prices the phase's epochs."""

    name: str = "phase"
    rounds: int = bounded(1, ge=1)
    algorithm: AlgorithmConfig = field(default_factory=default_algorithm_config, metadata={"tagged": ALGORITHM_CONFIGS})
    clients_per_round: int = bounded(0, ge=0)  # 0: the run's clients_per_round
    lr: float = bounded(0.0, ge=0.0)  # 0: train.lr
    epochs: int = bounded(0, ge=0)  # 0: train.epochs


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """One simulation: data, model, algorithm, local training, backend, rounds and output."""

    name: str = "experiment"
    setting: str = ""  # a label grouping runs in reports (e.g. paper 000's "setting3"); "" = the run dir's parent
    seed: int = bounded(0, ge=0)
    rounds: int = bounded(20, ge=1)
    clients_per_round: int = bounded(10, ge=1)
    eval_every: int = bounded(1, ge=1)  # evaluate the global model every N rounds (and after the last)
    # also evaluate the first-k uniform x p sub-model of the evaluated parameters at each of these width ratios, every
    # evaluated round, recorded as ``x{p}`` in evals.csv (nested-width methods: accuracy of each sub-model; needs an
    # elastic model)
    eval_widths: tuple[float, ...] = ()
    # also evaluate the all-device model every evaluated round: the reducer's mean over every client's last update
    # that reached the server (clients that never trained left out), not only this round's; paper 001 reports its
    # models so. Recorded as ``all_devices_acc``/``all_devices_loss`` (the main evaluation), ``all_devices_device_acc``
    # (the device average on it) and ``all_devices/<name>`` in evals.csv. Costs every client's last upload in memory
    eval_all_devices: bool = False
    # where run directories go: a local folder, or a storage URI (s3://bucket/prefix, gs://bucket/prefix; credentials
    # and endpoint from the AWS variables or the URI's query) the run is copied to at each checkpoint and at its end
    output_dir: str = "runs"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=CharLSTMConfig, metadata={"tagged": MODEL_CONFIGS})
    algorithm: AlgorithmConfig = field(default_factory=default_algorithm_config, metadata={"tagged": ALGORITHM_CONFIGS})
    train: TrainConfig = field(default_factory=TrainConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    server: ServerConfig = field(default_factory=ServerConfig)  # when the server aggregates (round policy)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    # Several phases, run one after another on one clock and one set of records; when given, they replace
    # ``algorithm`` and their rounds add up to ``rounds`` (``rayfl/engine/phases.py``).
    phases: tuple[PhaseConfig, ...] = ()
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # a round whose aggregate or server step is not finite is rolled back (the global model stays); this many such
    # rounds in a row stop the run with an error (engine/guard.py)
    max_nonfinite_rounds: int = bounded(3, ge=1)
    # the trained models a written run leaves in models/ (engine/persist/export.py) and where its metrics go besides its
    # record files (engine/persist/tracking.py)
    export: ExportConfig = field(default_factory=ExportConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        # ``algorithm.act: official`` (HeteroFL, FedRolex) sets the model's activation. It is resolved here, once,
        # so that every part of the run (driver, hosts, cost model, search, the written config) builds the same
        # model; phases that disagree are left as they are and reported by ``experiment/rules.py``.
        wanted = set(method_activations(self).values())
        if len(wanted) == 1:
            act, model = wanted.pop(), cast(Any, self.model)  # only models with an ``act`` field ask for one
            if act != model.act:
                object.__setattr__(self, "model", replace(model, act=act))

    @property
    def data_seed(self) -> int:
        """The seed the data set is built from: ``data.seed``, or the run's ``seed`` when that is unset."""
        return self.seed if self.data.seed is None else self.data.seed

    @property
    def algorithm_label(self) -> str:
        """The run's algorithm in summaries and messages: its name, or the phases' names joined by ``+``."""
        return "+".join(p.algorithm.name for p in self.phases) if self.phases else self.algorithm.name


def official_activation(model: Any) -> str | None:
    """The activation the official baselines' codes use in ``model``'s family: the family's default ``act`` (ReLU for
    the ResNet, GELU for the transformers); ``None`` for models without an activation choice."""
    for f in fields(model):
        if f.name == "act":
            return str(f.default)
    return None


def method_activations(cfg: ExperimentConfig) -> dict[int, str]:
    """The activation each of the run's algorithms asks the model for, by phase index (0 in a run without phases):
    ``official`` gives ``official_activation``, ``model`` the model's own ``act``; algorithms without an ``act`` field,
    and models without an activation choice, ask for nothing."""
    official = official_activation(cfg.model)
    if official is None:
        return {}
    algorithms = [p.algorithm for p in cfg.phases] or [cfg.algorithm]
    wanted: dict[int, str] = {}
    for index, algorithm in enumerate(algorithms):
        choice = getattr(algorithm, "act", None)
        if choice == "official":
            wanted[index] = official
        elif choice == "model":
            wanted[index] = str(cast(Any, cfg.model).act)
    return wanted
