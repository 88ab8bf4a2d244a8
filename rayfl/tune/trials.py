"""From a sweep to each trial's experiment config, resolved exactly as ``rayfl run`` would resolve it.

A trial's config is the base experiment (a file, or a mapping inline in the sweep file) with, in order, the sweep's
``overrides``, the ``base.KEY=value`` overrides of the command line and the trial's swept values applied through the
normal config loader, so every check ``rayfl validate`` makes applies. The sweep then sets what it owns: the run
directory (``output_dir`` = the sweep's ``trials`` folder, ``name`` = the trial's name) and an explicit CPU share per
client host (``trial_backend``). ``TrialPlan`` is small and picklable: Tune ships it to every trial, which rebuilds
its own config from it.

Relative paths set by any of these overrides resolve against the sweep file's directory (paths in a base file
resolve against that file's directory, as always), so a trial finds them whatever its working directory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rayfl.core.errors import ConfigError, KeyPath
from rayfl.engine.backend_choice import resolve_backend
from rayfl.experiment.loader import YamlSource, experiment_config
from rayfl.experiment.schema import ExperimentConfig
from rayfl.tune.resources import TrialResources, driver_bundles, one_process, trial_backend, trial_bundles
from rayfl.tune.space import Param, point_label, trial_overrides, validation_points

__all__ = ["Mode", "TrialPlan"]

Mode = Literal["train", "search_only"]


@dataclass(frozen=True)
class TrialPlan:
    """Everything a trial needs to build its config and run: Tune passes it to the trainable."""

    base: YamlSource  # the experiment document, no overrides applied
    overrides: tuple[str, ...]  # the sweep's, then the command line's ``base.`` ones
    override_dir: Path
    params: tuple[Param, ...]
    mode: Mode
    resources: TrialResources
    trials_dir: str  # an absolute path or a storage URI: trial run directories are created here

    def config(self, point: Mapping[str, Any], name: str | None = None) -> ExperimentConfig:
        """The experiment config of the trial with swept values ``point`` (``ConfigError`` when it is invalid)."""
        source = dataclasses.replace(self.base.part(()), override_dir=self.override_dir)
        for text in [*self.overrides, *trial_overrides(point)]:
            source.apply_override(text)
        cfg = experiment_config(source)
        # backend.kind: auto decided per trial, as for hosts in one process (a trial forks no workers: resources.py)
        cfg = resolve_backend(dataclasses.replace(cfg, backend=one_process(cfg.backend)))[0]
        return dataclasses.replace(
            cfg,
            name=name or point_label(point),
            output_dir=self.trials_dir,
            backend=trial_backend(cfg.backend, self.resources),
        )

    def bundles(self, cfg: ExperimentConfig) -> list[dict[str, float]]:
        """The placement-group bundles the trial running ``cfg`` reserves (``resources.py``)."""
        if self.mode == "search_only":
            return driver_bundles(self.resources.driver_cpus)
        return trial_bundles(cfg.backend, driver_cpus=self.resources.driver_cpus)

    def validate(
        self, sweep: YamlSource, origin_of: Mapping[str, KeyPath], given_as: Mapping[str, str] | None = None
    ) -> list[ExperimentConfig]:
        """Build the config of every point ``validation_points`` gives; the first invalid one raises a ``ConfigError``
        located in the sweep file. ``origin_of`` maps the text of each ``overrides`` entry and each swept key to where
        the sweep file writes it; ``given_as`` maps command-line overrides to the text the user typed."""
        configs = []
        for point in validation_points(self.params):
            try:
                configs.append(self.config(point))
            except ConfigError as err:
                raise _relocate(err, point, sweep, origin_of, given_as or {}) from err
        return configs


def _relocate(
    err: ConfigError,
    point: Mapping[str, Any],
    sweep: YamlSource,
    origin_of: Mapping[str, KeyPath],
    given_as: Mapping[str, str],
) -> ConfigError:
    """The loader's error, pointed at the sweep-file entry that set the offending value when the sweep set it."""
    trial = f" (trial {_point_text(point)})" if point else ""
    if err.override is None:  # a value of the base experiment itself: the loader named its file and line
        return ConfigError(err.reason + trial, err.key_path, file=err.file, line=err.line)
    swept = err.override.partition("=")[0].strip()
    at = origin_of.get(err.override)
    if at is None and swept in point:
        at = origin_of.get(swept)
    key = f"{err.key_path}: " if err.key_path and not (at is not None and err.key_path == swept) else ""
    if at is not None:
        return sweep.error(at, f"{key}{err.reason}{trial}")
    typed = given_as.get(err.override, err.override)  # a command-line override
    return ConfigError(f"{key}{err.reason}{trial}", file=sweep.file, override=typed)


def _point_text(point: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in point.items())
