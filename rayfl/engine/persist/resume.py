"""Where a run stands between rounds (``RunProgress``), what a checkpoint takes of it, and how a resumed run gets it
back from its run directory's newest checkpoint (``engine/persist/checkpoint.py``).

A resumed run builds its data, clock, algorithm and backend from its config exactly as a fresh run does, then puts
back what the rounds changed: the server state, the simulated clock, the clients' memories, the finished phases'
results, the record files (cut back to the checkpoint) and the counters. Only ``backend.*`` and ``checkpoint.*`` may
differ from the config the run was started with (records are the same on every backend, host and shard count); any
other difference is refused before anything starts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rayfl.core.errors import ConfigError
from rayfl.core.messages import Params, ServerState
from rayfl.engine.exec.backend import Backend, EvalResult
from rayfl.engine.guard import NonFiniteGuard
from rayfl.engine.persist.checkpoint import CheckpointRefused, CheckpointStore, Manifest, RunSnapshot
from rayfl.engine.persist.records import EvalRecord, RoundRecord, RunWriter
from rayfl.engine.phases import PhaseSchedule
from rayfl.experiment.loader import config_to_dict
from rayfl.experiment.schema import ExperimentConfig
from rayfl.system.clock import SimClock

__all__ = ["ResumePoint", "RunProgress", "load_resume_point", "resume_progress", "take_snapshot"]

# config sections a resumed run may change: they do not change any record
_MAY_CHANGE = ("backend", "checkpoint")
_NOT_COMPARED = ("name", "output_dir", *_MAY_CHANGE)


@dataclass
class RunProgress:
    """A run between two rounds: the round to run next, the state it starts from, and what was recorded so far."""

    next_round: int
    state: ServerState
    guard: NonFiniteGuard
    writer: RunWriter | None = None
    store: CheckpointStore | None = None
    records: list[RoundRecord] = field(default_factory=list)
    eval_records: list[EvalRecord] = field(default_factory=list)
    last_eval: EvalResult = field(default_factory=lambda: EvalResult(math.nan, math.nan, 0))
    wall_offset_s: float = 0.0  # wall seconds the run spent before this process took it over
    # every global tensor's value when first broadcast to padding clients (``client_state.first_values``)
    initial_params: Params = field(default_factory=dict)
    # the round policy's own state between server steps (an asynchronous run's clients in flight and their uploads,
    # ``engine/policies/buffered.py``); None for synchronous rounds
    policy_state: object | None = None


@dataclass(frozen=True)
class ResumePoint:
    """A run directory's newest checkpoint, read and checked against the config before the run starts."""

    run_dir: Path
    store: CheckpointStore
    manifest: Manifest
    snapshot: RunSnapshot


def load_resume_point(cfg: ExperimentConfig, run_dir: Path) -> ResumePoint:
    """The newest readable checkpoint of ``run_dir``; a one-line ``ConfigError`` when there is none or when ``cfg``
    differs from the run's config in anything but ``backend`` and ``checkpoint``."""
    where = str(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError("not a run directory (no config.yaml): give the directory a run wrote", file=where)
    check_same_config(cfg, run_dir)
    store = CheckpointStore(run_dir, cfg.checkpoint.keep)
    try:
        found = store.latest()
    except CheckpointRefused as err:
        raise ConfigError(err.reason, file=str(err.path)) from err
    if found is None:
        raise ConfigError(
            "holds no readable checkpoint to resume from (the run stopped before its first one, checkpoint.every "
            "was 0, or every checkpoint is damaged): start the run again",
            file=where,
        )
    manifest, snapshot = found
    if snapshot.rounds_done > cfg.rounds:
        raise ConfigError(
            f"its checkpoint is after round {snapshot.rounds_done - 1}, beyond rounds={cfg.rounds}", file=where
        )
    return ResumePoint(run_dir, store, manifest, snapshot)


def check_same_config(cfg: ExperimentConfig, run_dir: Path) -> None:
    """Refuse a config that differs from ``run_dir/config.yaml`` outside ``backend`` and ``checkpoint``."""
    path = run_dir / "config.yaml"
    saved = yaml.safe_load(path.read_text())
    given = yaml.safe_load(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))  # the same plain types as saved
    if not isinstance(saved, dict):
        raise ConfigError("is not a run's resolved config", file=str(path))
    # a key added to rayfl after the run was written (a section such as ``server``, a field such as ``data.path``)
    # counts as its default, which is what the run ran with
    saved = _filled(yaml.safe_load(yaml.safe_dump(_defaults_of(cfg), sort_keys=False)), saved)
    for key in sorted(set(saved) | set(given)):
        if key in _NOT_COMPARED:
            continue
        difference = _first_difference(saved.get(key), given.get(key), key)
        if difference is not None:
            at, was, now = difference
            raise ConfigError(
                f"the run was started with {was!r} and is resumed with {now!r}: a resumed run keeps its config (only "
                f"{' and '.join(f'{k}.*' for k in _MAY_CHANGE)} may change)",
                at,
                file=str(path),
            )


def _defaults_of(section: Any) -> dict[str, Any]:
    """A config section as a plain dict of its fields' defaults, nested sections (of the classes ``section`` holds:
    a tagged section's own variant) likewise; a field without a default is left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out[f.name] = _defaults_of(value)
        elif f.default is not dataclasses.MISSING:
            out[f.name] = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = _plain(f.default_factory())
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    return [_plain(v) for v in value] if isinstance(value, tuple | list) else value


def _filled(defaults: Any, saved: Any) -> Any:
    """``saved`` with the keys it lacks taken from ``defaults``, at every depth (``saved`` wins where both have one)."""
    if not (isinstance(defaults, dict) and isinstance(saved, dict)):
        return saved
    return {**defaults, **{k: _filled(defaults.get(k), v) for k, v in saved.items()}}


def _first_difference(a: Any, b: Any, at: str) -> tuple[str, Any, Any] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            found = _first_difference(a.get(key), b.get(key), f"{at}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{at}.{i}")
            if found is not None:
                return found
        return None
    same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return None if same else (at, a, b)


def resume_progress(
    cfg: ExperimentConfig, point: ResumePoint, clock: SimClock, backend: Backend, schedule: PhaseSchedule
) -> RunProgress:
    """Put the checkpoint back: the clock, the clients' memories and the phases' results in place, the record files
    cut back to the checkpoint; returns the progress the run continues from."""
    snap = point.snapshot
    try:
        writer = RunWriter.reopen(point.run_dir, point.manifest.record_sizes)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"its record files do not match its checkpoint ({err})", file=str(point.run_dir)) from err
    clock.now = snap.sim_time_s
    backend.load_client_states(dict(snap.client_states))
    schedule.results = dict(snap.phase_results)
    accuracy, loss, samples = snap.last_eval
    return RunProgress(
        next_round=snap.rounds_done,
        state=snap.state,
        guard=NonFiniteGuard(cfg.max_nonfinite_rounds, snap.nonfinite_streak),
        writer=writer,
        store=point.store,
        records=list(writer.rows),
        eval_records=list(writer.eval_rows),
        last_eval=EvalResult(accuracy, loss, samples),
        wall_offset_s=snap.wall_time_s,
        initial_params=dict(getattr(snap, "initial_params", {})),  # none in checkpoints written before it
        policy_state=getattr(snap, "policy_state", None),
    )


def take_snapshot(progress: RunProgress, clock: SimClock, schedule: PhaseSchedule, wall_time_s: float) -> RunSnapshot:
    """What a checkpoint after ``progress.next_round - 1`` holds (``RunSnapshot``), but the clients' memories: the
    checkpoint store writes those from ``Backend.client_state_batches``, batch by batch (``CheckpointStore.
    write_state``)."""
    last = progress.last_eval
    return RunSnapshot(
        rounds_done=progress.next_round,
        state=progress.state,
        sim_time_s=clock.now,
        client_states={},
        phase_results=dict(schedule.results),
        last_eval=(last.accuracy, last.loss, last.num_samples),
        nonfinite_streak=progress.guard.streak,
        wall_time_s=wall_time_s,
        initial_params=progress.initial_params,
        policy_state=progress.policy_state,
    )
