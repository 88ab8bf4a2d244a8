"""A trial's rayfl checkpoints as Tune checkpoints, so that ``rayfl sweep --resume`` (Tune's ``Tuner.restore``)
continues an interrupted trial mid-run instead of starting it over.

Every round whose record says a rayfl checkpoint was written (``checkpoint_bytes > 0``), the trial reports it to Tune
with its metrics: a directory holding copies of the checkpoint's state file and manifest, plus ``rayfl.json`` (their
names and what the trial's metrics carry forward: the last accuracy and loss, client accuracy, MACs so far). Nothing
in it is pickled: the state file is the checkpoint's safetensors file, the rest JSON, and ``restore_into`` checks
``rayfl.json`` (its names must be a checkpoint's own, in the folder, so a hostile one cannot copy files from
elsewhere); a checkpoint of the older, pickled format is refused in one line (``CheckpointRefused``). Tune
keeps the last few in its own storage. When Tune restores the trial, ``restore_into`` puts that checkpoint back into
the trial's run directory, removing any later one there (the trial continues from what Tune reported, exactly as
Tune's restore semantics say), and the trial resumes its run directory (``run_experiment(..., resume=run_dir)``),
whose record files are cut back to the checkpoint. The trial's run directory is the same folder of the sweep as
before (``<sweep>/trials/<trial>``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rayfl.engine.persist.checkpoint import CHECKPOINT_DIR, CheckpointRefused, CheckpointStore

__all__ = ["TrialCheckpoint", "pack", "restore_into"]

_INFO = "rayfl.json"
_STATE = re.compile(r"(round-\d{6,})\.safetensors")


@dataclass(frozen=True)
class TrialCheckpoint:
    """What ``rayfl.json`` says about a reported checkpoint."""

    manifest: str
    state: str
    carried: dict[str, float]  # ``RoundMetrics.carried`` when the checkpoint was reported


def pack(run_dir: Path, rounds_done: int, into: Path, carried: Mapping[str, float]) -> Path:
    """Copy the checkpoint after ``rounds_done`` of ``run_dir`` into the empty folder ``into`` (for
    ``tune.Checkpoint.from_directory``); hard links where the file system allows, copies elsewhere."""
    stem = CheckpointStore.stem(rounds_done)
    source = run_dir / CHECKPOINT_DIR
    for name in (f"{stem}.safetensors", f"{stem}.json"):
        _link_or_copy(source / name, into / name)
    info = TrialCheckpoint(f"{stem}.json", f"{stem}.safetensors", dict(carried))
    (into / _INFO).write_text(json.dumps(info.__dict__))
    return into


def restore_into(checkpoint_dir: Path, run_dir: Path) -> TrialCheckpoint:
    """Put a reported checkpoint back into ``run_dir``'s checkpoints and drop later ones there."""
    info = _read_info(checkpoint_dir / _INFO)
    target = run_dir / CHECKPOINT_DIR
    target.mkdir(parents=True, exist_ok=True)
    for name in (info.state, info.manifest):  # the state file first: a manifest always finds its state
        tmp = target / f"{name}.tmp"
        shutil.copyfile(checkpoint_dir / name, tmp)
        os.replace(tmp, target / name)
    store = CheckpointStore(run_dir, keep=1)
    for manifest in store.manifests():
        if manifest.name > info.manifest:  # zero-padded round numbers sort as numbers
            manifest.unlink()
    return info


def _read_info(path: Path) -> TrialCheckpoint:
    """``rayfl.json``, checked: the names of a checkpoint's manifest and state file (no other file), numbers carried."""
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from err
    if not isinstance(data, dict) or set(data) != {"manifest", "state", "carried"}:
        raise ValueError(f"{path}: not a rayfl trial checkpoint (manifest, state, carried)")
    state, manifest, carried = data["state"], data["manifest"], data["carried"]
    if isinstance(state, str) and state.endswith(".state"):
        reason = "is a trial checkpoint of an older rayfl (a pickle), which this rayfl does not load: restart the sweep"
        raise CheckpointRefused(reason, path)
    found = _STATE.fullmatch(state) if isinstance(state, str) else None
    if found is None or manifest != f"{found.group(1)}.json":
        raise ValueError(f"{path}: {state!r} and {manifest!r} are not one checkpoint's state file and manifest")
    if not isinstance(carried, dict) or not all(isinstance(v, int | float) for v in carried.values()):
        raise ValueError(f"{path}: carried is not a map of numbers")
    return TrialCheckpoint(manifest, state, dict(carried))


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
