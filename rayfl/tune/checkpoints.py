"""A trial's rayfl checkpoints as Tune checkpoints, so that ``rayfl sweep --resume`` (Tune's ``Tuner.restore``)
continues an interrupted trial mid-run instead of starting it over.

The checkpoint itself stays where the run wrote it: in the trial's run directory (``<sweep>/trials/<trial>``), on the
sweep's storage before the round's callbacks run (``engine/driver.py`` commits and pushes it first). What the trial
reports to Tune every round that wrote one is a marker: a folder holding only ``rayfl.json``, the names of that
checkpoint's manifest and state file. Tune keeps every marker (``sweep.py``: ``num_to_keep`` unset; each is one small
JSON file), so the experiment state Tune last saved never names a Tune checkpoint that is gone.

Why a marker, not a copy (as up to stop 58): with ``num_to_keep`` Tune deletes a trial's older checkpoints as it
registers new ones, but saves its experiment state only every few seconds, so a driver killed in between (SIGKILL, a
lost head) left a state naming a deleted checkpoint, and ``--resume`` failed on that trial ("Could not recover from
checkpoint as it does not exist on storage anymore": 1 of 4 runs of the two resume tests of
``tests/integration/test_cluster_sweeps.py``, and the CI of stop 58). Kept copies would double the checkpoints' bytes
(they also left out a checkpoint's client part files).

When Tune restores the trial, ``restore_into`` checks the marker (its names must be a checkpoint's own, so a hostile
one names nothing else) and the trial resumes its run directory from the newest checkpoint there, as ``rayfl run
--resume`` does: the one the marker names or, when Tune's state was saved before the trial's later checkpoints
(which the run's own ``checkpoint.keep`` may have pruned it for), a later one. Either way the records are cut back to
it, and the Tune metrics' running figures are rebuilt from the records before it (``RoundMetrics.replay``).

A marker of an earlier rayfl, which held copies of the state file and manifest, still restores: the copies go into the
run directory first. A state file of the older pickled format is refused in one line (``CheckpointRefused``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from rayfl.engine.persist.checkpoint import CHECKPOINT_DIR, CheckpointRefused, CheckpointStore

__all__ = ["TrialCheckpoint", "pack", "restore_into"]

_INFO = "rayfl.json"
_STATE = re.compile(r"(round-\d{6,})\.safetensors")
_KEYS = frozenset({"manifest", "state"})
_EARLIER_KEYS = _KEYS | {"carried"}  # an earlier rayfl's marker: the Tune metrics it carried are rebuilt now


@dataclass(frozen=True)
class TrialCheckpoint:
    """What a marker says (the checkpoint it was reported for), and which checkpoint the trial resumes from."""

    manifest: str
    state: str
    resumes_from: str = ""  # the newest manifest in the run directory after the restore


def pack(run_dir: Path, rounds_done: int, into: Path) -> Path:
    """Write the marker of ``run_dir``'s checkpoint after ``rounds_done`` rounds into the empty folder ``into`` (for
    ``tune.Checkpoint.from_directory``)."""
    stem = CheckpointStore.stem(rounds_done)
    manifest = run_dir / CHECKPOINT_DIR / f"{stem}.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest}: the round's checkpoint is not in the run directory")
    (into / _INFO).write_text(json.dumps({"manifest": manifest.name, "state": f"{stem}.safetensors"}))
    return into


def restore_into(checkpoint_dir: Path, run_dir: Path) -> TrialCheckpoint:
    """Check Tune's marker ``checkpoint_dir`` and get ``run_dir`` ready to resume: an earlier rayfl's copies put into
    its checkpoints; a ``ValueError`` when it holds no checkpoint at all (its storage lost it)."""
    info = _read_info(checkpoint_dir / _INFO)
    target = run_dir / CHECKPOINT_DIR
    if (checkpoint_dir / info.state).is_file() and (checkpoint_dir / info.manifest).is_file():
        target.mkdir(parents=True, exist_ok=True)
        for name in (info.state, info.manifest):  # the state file first: a manifest always finds its state
            tmp = target / f"{name}.tmp"
            shutil.copyfile(checkpoint_dir / name, tmp)
            os.replace(tmp, target / name)
    manifests = CheckpointStore(run_dir, keep=1).manifests()
    if not manifests:
        raise ValueError(
            f"{run_dir}: Tune restored the trial from its checkpoint {info.manifest}, but the trial's run directory "
            f"holds no checkpoint (its {CHECKPOINT_DIR}/ folder is gone): restart the sweep"
        )
    return TrialCheckpoint(info.manifest, info.state, manifests[-1].name)


def _read_info(path: Path) -> TrialCheckpoint:
    """``rayfl.json``, checked: the names of one checkpoint's manifest and state file, and nothing else."""
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from err
    if not isinstance(data, dict) or set(data) not in (_KEYS, _EARLIER_KEYS):
        raise ValueError(f"{path}: not a rayfl trial checkpoint (manifest, state)")
    state, manifest = data["state"], data["manifest"]
    if isinstance(state, str) and state.endswith(".state"):
        reason = "is a trial checkpoint of an older rayfl (a pickle), which this rayfl does not load: restart the sweep"
        raise CheckpointRefused(reason, path)
    found = _STATE.fullmatch(state) if isinstance(state, str) else None
    if found is None or manifest != f"{found.group(1)}.json":
        raise ValueError(f"{path}: {state!r} and {manifest!r} are not one checkpoint's state file and manifest")
    return TrialCheckpoint(manifest, state)
