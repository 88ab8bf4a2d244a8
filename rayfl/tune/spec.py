"""The sweep file: its schema, and ``load_sweep``, which checks everything before Tune starts.

A sweep file is YAML, opening with a comment that gives the exact command (``# rayfl sweep FILE``)::

    name: eps-tmax                    # default: the file's stem
    base: ../mini/shakespeare_bert.yaml   # an experiment file (relative to this file), or an inline mapping
    overrides: [rounds=2]             # dotted overrides of the base, as on `rayfl run`'s command line
    param_space:                      # dotted experiment keys -> values (rayfl/tune/space.py)
      algorithm.epsilon: [0.2, 0.8]
      seed: {randint: [0, 100]}
    search: random                    # grid (default; lists only) | random (draws num_samples per grid point)
    num_samples: 2
    max_concurrent_trials: 2          # 0 = as many as the cluster fits
    max_failures: 1                   # retries of a failed trial, each from its newest checkpoint
    scheduler: {kind: asha, metric: test_acc, mode: max, grace_period_s: 600, max_t_s: 7200, reduction_factor: 2}
    metric: test_acc                  # the results-table column that ranks trials (default: test_acc, or
                                      # memory_util for search-only sweeps) ...
    metric_mode: max                  # ... and whether larger is better (``mode`` is the run mode below)
    mode: train                       # train | search_only
    output_dir: runs/sweeps           # relative to the working directory, like an experiment's; on a multi-node
                                      # cluster, storage every node mounts at the same path, or an s3:// or gs://
                                      # URI (checked from every node, before Tune and as each trial starts)
    trial_resources: {driver_cpus: 0.25, cpus_per_host: 0.25}
    plot: {x: algorithm.epsilon, lines: algorithm.t_max, metrics: [memory_util, bandwidth_util, hit_rate]}

ASHA runs on *simulated* time: its time attribute is ``sim_time_s``, reported every round, so ``grace_period_s`` and
``max_t_s`` are simulated seconds. Command-line overrides: ``base.KEY=V`` overrides the base experiment,
``param_space.KEY=V`` sets a swept entry (``KEY`` dotted as in the file), and any other ``a.b=V`` sets a field of the
sweep file itself (``num_samples=2``, ``scheduler.max_t_s=100``).

Checks, each failing with a ``ConfigError`` naming the field, the file and the line: the sweep file's keys, types and
bounds (the experiment loader's machinery on the schema below), each distribution, keys the sweep owns (``name``,
``output_dir``) or sets twice, metric names, and then the experiment config of every trial, loaded through the normal
config loader from base + overrides + its values, so a mistyped key fails before Tune starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from rayfl.config.fields import bounded
from rayfl.core.errors import ConfigError, KeyPath
from rayfl.core.files import child_uri, is_storage_uri
from rayfl.experiment.loader import YamlSource
from rayfl.experiment.schema import ExperimentConfig
from rayfl.tune.metrics import REPORTED_METRICS, TABLE_METRICS
from rayfl.tune.resources import TrialResources
from rayfl.tune.space import Param, parse_param
from rayfl.tune.trials import Mode, TrialPlan

__all__ = ["OWNED_KEYS", "PlotConfig", "SchedulerConfig", "Sweep", "SweepConfig", "load_sweep"]

OWNED_KEYS = ("name", "output_dir")  # experiment keys the sweep sets for every trial


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """ASHA (asynchronous successive halving) on simulated time: trials are compared at ``grace_period_s``,
    ``grace_period_s * reduction_factor``, ... simulated seconds, and none runs past ``max_t_s``."""

    kind: Literal["asha"] = "asha"  # the one scheduler: asynchronous successive halving
    metric: str = "test_acc"  # a metric every trial reports each round (rayfl/tune/metrics.py)
    mode: Literal["max", "min"] = "max"  # whether a larger metric is better
    grace_period_s: float = bounded(3600.0, gt=0.0)  # simulated seconds before a trial can be stopped
    max_t_s: float = bounded(360000.0, gt=0.0)  # simulated seconds no trial runs past
    reduction_factor: float = bounded(2.0, gt=1.0)  # the share of trials kept at each rung is 1 / reduction_factor


@dataclass(frozen=True, kw_only=True)
class PlotConfig:
    """A figure of the results table: one panel per metric against swept key ``x``, one line per value of ``lines``;
    when ``x`` is a metric of the table, one point per trial instead (a scatter, one colour per value of ``lines``)."""

    x: str  # a swept key (one panel's x axis), or a metric of the results table (a scatter, one point per trial)
    lines: str = ""  # a swept key: one line (or colour) per value; "" = one line
    metrics: tuple[str, ...] = ("memory_util", "bandwidth_util", "hit_rate")  # results-table columns, one panel each
    file: str = "plot.png"  # in the sweep's folder


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """A sweep file: a base experiment, the experiment keys it sweeps, how Tune searches and schedules the trials,
    what ranks them and where they go."""

    name: str = ""  # the sweep's folder under output_dir; "" = the file's stem
    # an experiment file (relative to the sweep file) or an inline mapping of one
    base: str | dict[str, Any] = ""
    overrides: tuple[str, ...] = ()  # dotted overrides of the base, as on `rayfl run`'s command line
    # dotted experiment keys -> a list (grid) or {grid|choice: [...]}, {uniform|loguniform|randint: [lo, hi]}
    param_space: dict[str, Any] = field(default_factory=dict)
    search: Literal["grid", "random"] = "grid"  # grid: lists only; random: num_samples draws per grid point
    num_samples: int = bounded(1, ge=1)  # draws per grid point (search: random)
    search_seed: int = bounded(0, ge=0)  # seeds Tune's draws for search: random
    max_concurrent_trials: int = bounded(0, ge=0)  # 0 = as many as the cluster fits
    max_failures: int = bounded(1, ge=0)  # Tune's FailureConfig: retries of a failed trial from its newest checkpoint
    scheduler: SchedulerConfig | None = None  # none: every trial runs all its rounds
    metric: str = ""  # "" = test_acc for training sweeps, memory_util for search-only ones
    metric_mode: Literal["max", "min"] = "max"  # whether a larger metric is better (`mode` is the run mode)
    mode: Mode = "train"  # train | search_only (the assignment over the budgets alone, no training)
    # relative to the working directory; on a multi-node cluster, storage every node mounts at the same path, or a
    # storage URI (s3://bucket/prefix, gs://bucket/prefix) every node can write
    output_dir: str = "runs/sweeps"
    trial_resources: TrialResources = field(default_factory=TrialResources)
    plot: PlotConfig | None = None  # none: no figure


@dataclass(frozen=True)
class Sweep:
    """A checked sweep: its file's fields, the swept parameters, the trials' plan and the configs checked."""

    file: str
    name: str
    config: SweepConfig
    params: tuple[Param, ...]
    plan: TrialPlan
    checked: list[ExperimentConfig]  # one per validation point (the first is a representative trial)

    @property
    def output_dir(self) -> str:
        """Where the sweep's folder goes: a local path (relative to the working directory) or a storage URI."""
        return self.config.output_dir


def load_sweep(path: str | Path, overrides: Sequence[str] = ()) -> Sweep:
    """Read and check a sweep file with command-line ``overrides`` (module docstring); nothing is written."""
    source = YamlSource.read(path)
    if not isinstance(source.data, dict):
        raise source.error((), "the top level must be a mapping of sweep fields")
    given_as = _apply_cli(source, overrides)
    base_overrides = list(given_as)
    cfg: SweepConfig = source.build(SweepConfig)
    if not cfg.metric:
        cfg = dataclasses.replace(cfg, metric="memory_util" if cfg.mode == "search_only" else "test_acc")
    sweep_dir = source.base_dir
    base = _base_source(cfg, source, sweep_dir)
    params = tuple(parse_param(k, v, source, ("param_space", k)) for k, v in cfg.param_space.items())
    origin_of = _check_keys(cfg, params, source)
    _check_search(cfg, params, source)
    _check_metrics(cfg, params, source)
    name = cfg.name or Path(path).stem
    plan = TrialPlan(
        base=base,
        overrides=(*cfg.overrides, *base_overrides),
        override_dir=sweep_dir,
        params=params,
        mode=cfg.mode,
        resources=cfg.trial_resources,
        # where the trials of a sweep run from here would write (``run_sweep`` picks the fresh folder it creates)
        trials_dir=_trials_dir(cfg.output_dir, name),
    )
    checked = plan.validate(source, origin_of, given_as)
    for cfg_checked in checked:
        plan.bundles(cfg_checked)  # a bad resource combination fails here, not in Tune
    return Sweep(file=str(path), name=name, config=cfg, params=params, plan=plan, checked=checked)


def _trials_dir(output_dir: str, name: str) -> str:
    """``output_dir/name/trials``: an absolute path, or a URI below a storage URI."""
    if is_storage_uri(output_dir):
        return child_uri(output_dir, name, "trials")
    return str((Path(output_dir) / name / "trials").absolute())


def _apply_cli(source: YamlSource, overrides: Sequence[str]) -> dict[str, str]:
    """Apply the command line's sweep-field and ``param_space.`` overrides; return its ``base.`` ones (as overrides
    of the experiment, in order, each mapped to the text as typed)."""
    base: dict[str, str] = {}
    for text in overrides:
        key, sep, value = text.partition("=")
        key = key.strip()
        if key.startswith("base.") and sep:
            base[f"{key.removeprefix('base.')}={value}"] = text
        elif key.startswith("param_space.") and sep:
            entry = key.removeprefix("param_space.")
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError as err:
                raise ConfigError(f"invalid YAML: {err}", file=source.file, override=text) from err
            space = source.data.setdefault("param_space", {})
            if not isinstance(space, dict):
                raise source.error(("param_space",), "expected a mapping of swept keys")
            space[entry] = parsed
            source.origins[("param_space", entry)] = text
        else:
            source.apply_override(text)
    return base


def _base_source(cfg: SweepConfig, source: YamlSource, sweep_dir: Path) -> YamlSource:
    if isinstance(cfg.base, dict):
        return source.part(("base",))
    if not cfg.base:
        raise source.error(("base",), "required: an experiment file (relative to the sweep file) or an inline mapping")
    path = Path(cfg.base).expanduser()
    resolved = path if path.is_absolute() else sweep_dir / path
    if not resolved.is_file():
        raise source.error(("base",), f"experiment file {cfg.base!r} does not exist (resolved to {resolved.resolve()})")
    return YamlSource.read(resolved)


def _check_keys(cfg: SweepConfig, params: Sequence[Param], source: YamlSource) -> dict[str, KeyPath]:
    """Keys the sweep owns or sets twice; returns where each override entry and swept key is written."""
    origin_of: dict[str, KeyPath] = {}
    set_by: dict[str, KeyPath] = {}
    for index, text in enumerate(cfg.overrides):
        at: KeyPath = ("overrides", index)
        key = text.partition("=")[0].strip()
        origin_of[text] = at
        set_by.setdefault(key, at)
        if key in OWNED_KEYS:
            raise source.error(at, f"'{key}' is set by the sweep for every trial (use the sweep's own '{key}')")
    for p in params:
        at = ("param_space", p.key)
        origin_of[p.key] = at
        if p.key in OWNED_KEYS:
            raise source.error(at, f"'{p.key}' is set by the sweep for every trial and cannot be swept")
        if p.key in set_by:
            line = source.origin(set_by[p.key])
            raise source.error(at, f"'{p.key}' is both swept and set in overrides (line {line}); keep one")
    return origin_of


def _check_search(cfg: SweepConfig, params: Sequence[Param], source: YamlSource) -> None:
    if cfg.search == "grid":
        for p in params:
            if p.sampled:
                raise source.error(
                    ("param_space", p.key, p.kind),
                    f"'{p.kind}' draws values, but search is 'grid' (lists only): set `search: random`",
                )


def _check_metrics(cfg: SweepConfig, params: Sequence[Param], source: YamlSource) -> None:
    if cfg.metric not in TABLE_METRICS:
        raise source.error(
            ("metric",), f"unknown metric '{cfg.metric}'; the results table has {', '.join(TABLE_METRICS)}"
        )
    if cfg.scheduler is not None and cfg.scheduler.metric not in REPORTED_METRICS:
        raise source.error(
            ("scheduler", "metric"),
            f"unknown metric '{cfg.scheduler.metric}'; trials report {', '.join(REPORTED_METRICS)}",
        )
    if cfg.plot is not None:
        keys = [p.key for p in params]
        for name in ("x", "lines"):
            value = getattr(cfg.plot, name)
            if name == "x" and value in TABLE_METRICS:
                continue  # a figure of the table: one point per trial (client accuracy against training MACs)
            if (value or name == "x") and value not in keys:
                known = f"swept: {', '.join(keys) or 'none'}" + ("; or a results metric" if name == "x" else "")
                raise source.error(("plot", name), f"'{value}' is not a swept key; {known}")
        for index, metric in enumerate(cfg.plot.metrics):
            if metric not in TABLE_METRICS:
                raise source.error(
                    ("plot", "metrics", index), f"unknown metric '{metric}'; use {', '.join(TABLE_METRICS)}"
                )
