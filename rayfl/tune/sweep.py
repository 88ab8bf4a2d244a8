"""Running a sweep: Ray, Tune's ``Tuner`` over the trials, then the results table, the best trial and the plot.

A sweep writes one fresh folder ``<output_dir>/<name>`` (``name-1`` ... when taken)::

    sweep.yaml          the sweep file as given, plus the command-line overrides
    resume.json         the sweep file's path and the overrides, for ``rayfl sweep --resume`` (``resume_sweep``)
    trials/<trial>/     one normal run directory per trial (``rayfl report`` reads them)
    tune/               Tune's own records
    results.csv, results.parquet, results.md    one row per trial
    <plot.file>         when the sweep file asks for a plot

rayfl connects to the Ray cluster the base experiment names (``backend.address``) or starts a local one, and shuts
down only a Ray it started. Before anything is written it checks, each refusal one line, that every trial's bundles
can be placed on the cluster's node types (``fit.py``: Tune would otherwise wait forever for a placement group that can
never be granted), and, when more than one node is alive, that every node sees the sweep's folder at the same path
(``cluster.py``: Tune's checkpoints and the trials' run directories live there, and Ray copies nothing off a
head-local disk). A trial that fails is retried ``max_failures`` times from its run directory's newest checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from rayfl.core.errors import ConfigError
from rayfl.core.files import is_storage_uri
from rayfl.engine.persist.checkpoint import CHECKPOINT_DIR
from rayfl.engine.persist.records import make_run_dir
from rayfl.engine.persist.storage import RunMirror, check_storage, download, open_storage
from rayfl.engine.ray.head import off_node, reserved_head
from rayfl.experiment.rules import output_dir_problem
from rayfl.tune.cluster import SWEEP_MARKER, check_shared_storage, node_types
from rayfl.tune.fit import fit_problem
from rayfl.tune.plots import plot_sweep
from rayfl.tune.results import (
    TrialOutcome,
    at_or_below_baseline,
    best_trial,
    markdown_table,
    results_table,
    write_table,
)
from rayfl.tune.space import point_label, tune_space
from rayfl.tune.spec import Sweep
from rayfl.tune.trainable import run_trial
from rayfl.tune.trials import TrialPlan

__all__ = ["RESUME_FILE", "SweepResult", "load_resumed_sweep", "run_sweep"]

RESUME_FILE = SWEEP_MARKER  # written first: a trial whose node does not see it is not on the sweep's storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepResult:
    """A finished sweep: its folder, the results table and what was written."""

    sweep_dir: Path
    table: pd.DataFrame
    markdown: str
    best: Mapping[str, Any] | None
    files: list[Path]
    wall_s: float
    unfinished: int = 0  # trials an interruption left unfinished or unstarted (``rayfl sweep --resume`` runs them)
    # the sweep's URI when it is on storage by URI (``sweep_dir`` is then its local staging folder), else ""
    location: str = ""


def run_sweep(
    sweep: Sweep, *, overrides: Sequence[str] = (), verbose: int = 0, resume: Path | str | None = None
) -> SweepResult:
    """Run every trial of ``sweep`` with Tune and tabulate them; ``verbose`` is Tune's console verbosity (0-2). With
    ``resume`` (the folder of an interrupted run of this sweep) Tune restores it (``Tuner.restore``): finished trials
    stay, interrupted ones continue from their run directories' newest checkpoints (``checkpoints.py``), the others
    start."""
    import ray
    from ray import tune

    from rayfl.engine.ray.backend import ensure_ray, release_warm_pool

    began = time.perf_counter()
    cfg = sweep.config
    if resume is None:
        _check_storage(sweep)  # a missing, unreachable or read-only location: one line, before Ray starts
    started = ensure_ray(sweep.checked[0].backend)
    release_warm_pool()  # a warm pool of an earlier run in this process would hold CPUs the trials need
    try:
        # before anything is written or any trial runs: every trial can be placed, and every node sees the folder
        _check_fits(sweep)
        if resume is None:
            sweep_dir, mirror = _new_sweep_dir(sweep)
            _write_copy(sweep, overrides, sweep_dir / "sweep.yaml")
            (sweep_dir / RESUME_FILE).write_text(
                json.dumps({"file": str(Path(sweep.file).absolute()), "overrides": list(overrides)})
            )
            if mirror is not None:
                mirror.push(_TUNE_OWNED)
        else:
            sweep_dir, mirror = _resumed_sweep_dir(resume, sweep.file)
        log.info("sweep folder %s (trials' run directories and Tune's checkpoints)", sweep_dir)
        # on storage by URI, Tune writes there through the same pyarrow file system, and so does every trial
        trials_dir = mirror.remote.child("trials").uri if mirror is not None else str(sweep_dir / "trials")
        storage_path = mirror.remote.path if mirror is not None else str(sweep_dir)
        filesystem = mirror.remote.fs if mirror is not None else None
        plan = dataclasses.replace(sweep.plan, trials_dir=trials_dir)
        if resume is None:
            tuner = _tuner(sweep, plan, storage_path, filesystem, verbose)
        else:
            _warn_if_unreadable(f"{storage_path}/tune", filesystem)
            tuner = tune.Tuner.restore(
                f"{storage_path}/tune",
                _trainable(sweep, plan),
                resume_unfinished=True,
                resume_errored=True,
                # when Tune cannot read its state it starts the sweep afresh: with the space, the same trials (names
                # included), each continuing from its run directory's newest checkpoint (trainable.py)
                param_space=tune_space(sweep.params),
                storage_filesystem=filesystem,
            )
        with _markers_keep_only_their_iteration():
            grid = tuner.fit()
        local_trials = sweep_dir / "trials"
        if mirror is not None:  # the trials' records, for the table (their checkpoints stay on the storage)
            download(mirror.remote.child("trials"), local_trials, frozenset({CHECKPOINT_DIR}))
        outcomes = [_outcome(result, plan, local_trials) for result in grid]
    finally:
        if started:
            ray.shutdown()
    table = results_table(outcomes)
    # Tune marks every trial terminated as it cleans up after an interrupt (its saved state keeps them running, for
    # the restore): the table calls a trial interrupted when its last result is not marked done and its records stop
    # short of its rounds (results.py)
    unfinished = int((table["status"] == "interrupted").sum()) + max(0, expected_trials(sweep) - len(outcomes))
    files = list(write_table(table, sweep_dir))
    keys = [p.key for p in sweep.params]
    best = best_trial(table, cfg.metric, cfg.metric_mode)
    best_line = _best_line(best, keys, cfg.metric, sweep_dir)
    text = f"# Sweep {sweep.name}\n\n" + markdown_table(table, keys) + "\n" + best_line
    if cfg.plot is not None:
        png = plot_sweep(table, sweep_dir / cfg.plot.file, cfg.plot.x, cfg.plot.lines, cfg.plot.metrics)
        files.append(png)
        text += f"\n![{png.stem}]({png.name})\n"
    (sweep_dir / "results.md").write_text(text, encoding="utf-8")
    files.append(sweep_dir / "results.md")
    location = ""
    if mirror is not None:
        mirror.push(_TUNE_OWNED)
        location = mirror.remote.shown
    wall_s = time.perf_counter() - began
    return SweepResult(sweep_dir, table, text, best, files, wall_s, unfinished, location)


# the folders of a sweep on storage by URI that Tune and the trials write there themselves
_TUNE_OWNED = frozenset({"trials", "tune"})


def _check_storage(sweep: Sweep) -> None:
    """The sweep's ``output_dir`` takes writes from here, each refusal one line on ``output_dir``: storage by URI
    takes a probe file (a missing bucket, an endpoint that does not answer, a location that refuses writes), a local
    folder is made (a read-only mount, a path under ``/proc``, a folder of another user)."""
    if is_storage_uri(sweep.output_dir):
        check_storage(open_storage(sweep.output_dir), "output_dir", file=sweep.file)
        return
    problem = output_dir_problem(sweep.output_dir)
    if problem:
        raise ConfigError(problem, "output_dir", file=sweep.file)
    folder = Path(sweep.output_dir).absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        reason = f"cannot make {folder} ({err.strerror or err}): give a directory you can write"
        raise ConfigError(reason, "output_dir", file=sweep.file) from err


def _new_sweep_dir(sweep: Sweep) -> tuple[Path, RunMirror | None]:
    """The sweep's fresh folder ``<output_dir>/<name>`` (its storage checked by ``_check_storage``) once every alive
    node sees the storage: a local folder, or on storage by URI a staging folder copied there (with its mirror)."""
    if is_storage_uri(sweep.output_dir):
        check_shared_storage(open_storage(sweep.output_dir), sweep.file)
        sweep_dir = _in_file(sweep.file, make_run_dir, sweep.output_dir, sweep.name)
        return sweep_dir, RunMirror.of(sweep_dir)
    check_shared_storage(Path(sweep.output_dir).absolute(), sweep.file)
    return _in_file(sweep.file, make_run_dir, sweep.output_dir, sweep.name).absolute(), None


def _resumed_sweep_dir(resume: Path | str, sweep_file: str) -> tuple[Path, RunMirror | None]:
    """An interrupted sweep's folder, checked as a new one is (every node sees it); on storage by URI its own files
    read back into a staging folder (Tune reads ``tune/`` and the trials their records from the storage)."""
    if isinstance(resume, str) and is_storage_uri(resume):
        mirror = _pulled_sweep(resume)
        check_shared_storage(mirror.remote, sweep_file)
        return mirror.local, mirror
    sweep_dir = Path(resume).absolute()
    check_shared_storage(sweep_dir, sweep_file)
    return sweep_dir, None


def _pulled_sweep(uri: str) -> RunMirror:
    """The sweep folder ``uri`` read back into a staging folder (its own files: not the trials' or Tune's)."""
    mirror = RunMirror.staging(uri, key="--resume")
    check_storage(mirror.remote, "--resume")  # the resumed sweep writes there
    mirror.pull(_TUNE_OWNED)
    return mirror


def _in_file(file: str, make: Any, *args: Any) -> Any:
    """``make(*args)``, its ``ConfigError`` located in the sweep file ``file``."""
    try:
        return make(*args)
    except ConfigError as err:
        if err.file is not None:
            raise
        raise ConfigError(err.reason, err.key_path, file=file) from err


def expected_trials(sweep: Sweep) -> int:
    """How many trials the sweep runs: ``num_samples`` times every combination of its grid values."""
    count = sweep.config.num_samples
    for param in sweep.params:
        if param.kind == "grid":
            count *= len(param.values)
    return count


def _trainable(sweep: Sweep, plan: TrialPlan) -> Any:
    """The trial function with its plan and per-trial placement group (the same on a fresh start and a restore)."""
    from ray import tune

    keys = [p.key for p in sweep.params]
    strategy = sweep.config.trial_resources.strategy

    def resources(config: dict[str, Any]) -> Any:
        cfg = plan.config({k: config[k] for k in keys})
        bundles = plan.bundles(cfg)
        keep_off = off_node(reserved_head(cfg.backend.head))  # a reserved head holds none of the trial's bundles
        if keep_off is None:
            return tune.PlacementGroupFactory(bundles, strategy=strategy)
        return tune.PlacementGroupFactory(bundles, strategy=strategy, bundle_label_selector=[keep_off] * len(bundles))

    return tune.with_resources(tune.with_parameters(run_trial, plan=plan), resources=resources)


def _tuner(sweep: Sweep, plan: TrialPlan, storage_path: str, filesystem: Any, verbose: int) -> Any:
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    cfg = sweep.config
    keys = [p.key for p in sweep.params]

    def trial_name(trial: Any) -> str:
        index = str(trial.trial_id).rsplit("_", 1)[-1]
        return f"{index}_{point_label({k: trial.config[k] for k in keys})}" if keys else index

    scheduler = None
    if cfg.scheduler is not None:
        from rayfl.tune.asha import EvaluatedASHA

        s = cfg.scheduler
        scheduler = EvaluatedASHA(
            time_attr="sim_time_s",  # simulated time, reported every round
            metric=s.metric,
            mode=s.mode,
            max_t=s.max_t_s,
            grace_period=s.grace_period_s,
            reduction_factor=s.reduction_factor,
        )
    return tune.Tuner(
        _trainable(sweep, plan),
        param_space=tune_space(sweep.params),
        tune_config=tune.TuneConfig(
            # the variant generator limits concurrency itself (TuneConfig's limit applies to Searchers only)
            search_alg=BasicVariantGenerator(max_concurrent=cfg.max_concurrent_trials, random_state=cfg.search_seed),
            scheduler=scheduler,
            num_samples=cfg.num_samples,
            trial_name_creator=trial_name,
            trial_dirname_creator=trial_name,
        ),
        run_config=tune.RunConfig(
            name="tune",
            storage_path=storage_path,
            storage_filesystem=filesystem,  # None: a local path; else the sweep's storage (pyarrow, as Tune's own)
            verbose=verbose,
            # a trial that fails (its node lost, an actor gone) is retried from its run directory's newest checkpoint
            failure_config=tune.FailureConfig(max_failures=cfg.max_failures),
            # markers of the trials' rayfl checkpoints (checkpoints.py), every one kept: Tune saves its state every few
            # seconds, and with num_to_keep a driver killed in between leaves a state that names a deleted checkpoint;
            # Tune's state holds each marker with its training_iteration only (_markers_keep_only_their_iteration)
            checkpoint_config=tune.CheckpointConfig(num_to_keep=None, checkpoint_score_attribute="training_iteration"),
        ),
    )


def _warn_if_unreadable(tune_dir: str, filesystem: Any) -> None:
    """Say so in one line when Tune's newest experiment state (which ``Tuner.restore`` reads) is not whole JSON: Tune
    writes it in place every few seconds, so a driver killed meanwhile can leave it cut short. Tune then logs "Failed
    to restore the run state" and starts afresh."""
    from pyarrow import fs as pafs

    fs = filesystem if filesystem is not None else pafs.LocalFileSystem()
    states: list[str] = []
    try:
        found = fs.get_file_info(pafs.FileSelector(tune_dir, allow_not_found=True))
        states = sorted(i.path for i in found if Path(i.path).name.startswith("experiment_state-"))
        if not states:
            return
        with fs.open_input_stream(states[-1]) as stream:
            json.loads(stream.read())
    except (OSError, ValueError) as err:
        log.warning(
            "Tune's state %s cannot be read (%s): Tune starts the sweep afresh, and each trial continues from its "
            "run directory's newest checkpoint",
            states[-1] if states else tune_dir,
            str(err).splitlines()[0][:200],
        )


_ONLY_SCORE = "TUNE_ONLY_STORE_CHECKPOINT_SCORE_ATTRIBUTE"


@contextlib.contextmanager
def _markers_keep_only_their_iteration() -> Iterator[None]:
    """While Tune runs the sweep in this process, its state keeps each reported checkpoint with the checkpoint's
    score attribute (``training_iteration``, what a restored trial counts on from) instead of the round's whole
    metrics dict: since every marker is kept, that state grows with every checkpoint (measured: 2.3 KB of
    ``experiment_state-*.json`` per checkpoint with the whole dict, 0.34 KB with the iteration). A restored trial's
    ``time_total_s`` (Tune's own, which rayfl reads nowhere) then counts from the restore."""
    before = os.environ.get(_ONLY_SCORE)
    os.environ[_ONLY_SCORE] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_ONLY_SCORE, None)
        else:
            os.environ[_ONLY_SCORE] = before


def _outcome(result: Any, plan: TrialPlan, trials_dir: Path) -> TrialOutcome:
    name = Path(result.path).name
    point = {p.key: result.config[p.key] for p in plan.params}
    error = "" if result.error is None else f"{type(result.error).__name__}: {result.error}".splitlines()[0][:300]
    try:
        planned: int | None = plan.config(point).rounds
    except ValueError:  # a ConfigError: the trial's own error says why
        planned = None
    return TrialOutcome(
        name,
        point,
        trials_dir / name,
        errored=result.error is not None,
        error=error,
        reported=dict(result.metrics or {}),  # the fallback when the run directory cannot be read here
        planned_rounds=planned,
        # a finished trial's last result may lack it in a state Tune saved before the end (a restored trial's):
        # the table also asks its records
        interrupted=result.error is None and not (result.metrics or {}).get("done", False),
    )


def load_resumed_sweep(where: Path | str) -> tuple[Sweep, list[str]]:
    """The sweep an interrupted sweep folder (a path, or a storage URI) was started from, with its command-line
    overrides; a ``ConfigError`` when the folder is not a sweep's or its sweep file changed since (a restore must run
    the same trials)."""
    from rayfl.tune.spec import load_sweep

    if isinstance(where, str) and is_storage_uri(where):
        mirror = _pulled_sweep(where)
        sweep_dir, has_tune = mirror.local, mirror.remote.child("tune").exists()
    else:
        sweep_dir = Path(where)
        has_tune = (sweep_dir / "tune").is_dir()
    info_path = sweep_dir / RESUME_FILE
    if not info_path.is_file() or not has_tune:
        raise ConfigError(f"not a sweep folder that can resume (no {RESUME_FILE} or tune/)", file=str(where))
    info = json.loads(info_path.read_text())
    file, overrides = Path(info["file"]), [str(o) for o in info["overrides"]]
    copy = (sweep_dir / "sweep.yaml").read_text(encoding="utf-8")
    if not file.is_file() or not copy.startswith(file.read_text(encoding="utf-8")):
        raise ConfigError(
            f"the sweep file {file} is gone or changed since the sweep started (its copy is sweep.yaml): restore it",
            file=str(where),
        )
    return load_sweep(file, overrides), overrides


def _check_fits(sweep: Sweep) -> None:
    """Refuse, in one line, a sweep some trial of which can never be placed on the cluster's node types (``fit.py``);
    a sweep the autoscaler could serve by launching nodes passes."""
    strategy = sweep.config.trial_resources.strategy
    for cfg in sweep.checked:
        bundles = sweep.plan.bundles(cfg)
        problem = fit_problem(bundles, node_types(reserved_head(cfg.backend.head)), strategy)
        if problem is not None:
            raise ConfigError(
                f"a trial can never be placed, {problem}; lower trial_resources (driver_cpus, cpus_per_host), "
                "backend.num_hosts or backend.gpus_per_host, or add nodes",
                "trial_resources",
                file=sweep.file,
            )


def _best_line(best: Mapping[str, Any] | None, keys: Sequence[str], metric: str, sweep_dir: Path) -> str:
    """The best trial, its run directory given relative to ``results.md`` so the file reads the same anywhere."""
    if best is None:
        return f"Best trial: none (no trial has a finite {metric}).\n"
    values = ", ".join(f"{k}={best[k]}" for k in keys)
    score = f"{metric} = {best[metric]:.4g}"
    baseline = best.get("baseline_acc")
    if metric.endswith("acc") and isinstance(baseline, float) and math.isfinite(baseline):
        below = at_or_below_baseline(best, metric)
        score += f" ({'AT OR BELOW' if below else 'above'} its most-frequent-label baseline {baseline:.4g}"
        score += ": it learned nothing a constant guess does not)" if below else ")"
    run_dir = os.path.relpath(best["run_dir"], sweep_dir)
    return f"Best trial by {metric}: {best['trial']} ({values}): {score}; run dir {run_dir}\n"


def _write_copy(sweep: Sweep, overrides: Sequence[str], path: Path) -> None:
    text = Path(sweep.file).read_text(encoding="utf-8")
    if overrides:
        text += "\n# command-line overrides:\n" + yaml.safe_dump({"_overrides": list(overrides)}, sort_keys=False)
    path.write_text(text, encoding="utf-8")
