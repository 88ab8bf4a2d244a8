"""Checkpoints: everything the rounds after a round depend on, so that a resumed run continues bit for bit.

What a checkpoint after ``n`` finished rounds holds (``RunSnapshot``):

* ``state``: the ``ServerState``: every global model's parameters and architecture, the server optimizer's state and
  the algorithm's own state (model search's pool, FedorAS's tiers and search populations);
* ``client_states``: every client's memory (``Backend.client_states``: padding models, per-client algorithm state);
* ``initial_params``: with padding, each global tensor's value from the first round that broadcast it, what a client
  pads from where its memory has nothing (``client_state.first_values``);
* ``sim_time_s``: the simulated clock. It is the clock's only changing state: budgets, traces, availability and link
  draws are pure functions of (client, simulated time, round), so there is no trace or link cursor to keep;
* ``phase_results``: what finished phases reported (``PhaseSchedule.results``, FedorAS's chosen paths);
* the last evaluation, the count of rolled-back rounds in a row (``guard.py``) and the wall seconds so far;
* no RNG positions: every random draw comes from a generator derived from (seed, purpose, round, client)
  (``rayfl/core/rng.py``), so round ``n`` draws the same numbers whether or not the run was resumed before it;
* the record files, by length: the manifest holds each CSV file's byte length at the checkpoint, and a resumed run cuts
  the files back to it and reads the rows back (``RunWriter.reopen``), dropping rounds written after the checkpoint.

Files, in ``RUN_DIR/checkpoints``:

* ``round-000012.state``: ``torch.save`` of the snapshot, written before the round's records so that its size and
  write time can go in the round's record (``checkpoint_bytes``, ``checkpoint_s``);
* ``round-000012.json``: the manifest (rounds done, the state file's name, size and SHA-256 digest, the record files'
  lengths), written after the round's records. A checkpoint exists once its manifest does.

Both are written to a temporary file, flushed to disk (``fsync``) and renamed over the final name, and the record files
are flushed to disk before the manifest names their lengths, so a crash at any point leaves either the previous
checkpoint or the new one. The last ``keep`` checkpoints are kept. A state file whose size or digest differs from its
manifest's, or that does not load, is skipped with a warning and the checkpoint before it is used: most damage to a
``torch.save`` file (bytes inside a tensor's data) still loads, silently, so the digest is what catches it. Loading a
checkpoint unpickles it (as ``torch.load`` does): resume only run directories you trust.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import torch

from rayfl.core.messages import Params, ServerState

__all__ = ["CHECKPOINT_DIR", "CheckpointStore", "Manifest", "PendingCheckpoint", "RunSnapshot"]

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
_FORMAT = 1
_NAME = re.compile(r"round-(\d{6,})\.json")


@dataclass(frozen=True)
class RunSnapshot:
    """What the rounds after ``rounds_done`` depend on besides the config (see module docstring)."""

    rounds_done: int
    state: ServerState
    sim_time_s: float
    client_states: dict[int, object]
    phase_results: dict[int, dict[str, object]]
    last_eval: tuple[float, float, int]  # accuracy, loss and samples of the last evaluation
    nonfinite_streak: int
    wall_time_s: float
    # each global tensor's value when first broadcast to padding clients (their fallback where they remember nothing)
    initial_params: Params = field(default_factory=dict)


@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint: its state file and the record files' lengths when it was taken."""

    rounds_done: int
    state_file: str
    state_bytes: int
    record_sizes: dict[str, int]
    format: int = _FORMAT
    state_sha256: str = ""  # "" in checkpoints of a rayfl before digests: their size alone is checked


@dataclass(frozen=True)
class PendingCheckpoint:
    """A state file written and not yet committed (its manifest follows the round's records)."""

    rounds_done: int
    path: Path
    state_bytes: int
    write_s: float
    sha256: str = ""


class CheckpointStore:
    """The checkpoints of one run directory: write, commit, prune, find the newest that loads."""

    def __init__(self, run_dir: Path, keep: int) -> None:
        self.dir = run_dir / CHECKPOINT_DIR
        self.keep = max(1, int(keep))

    @staticmethod
    def stem(rounds_done: int) -> str:
        return f"round-{rounds_done:06d}"

    def write_state(self, snapshot: RunSnapshot) -> PendingCheckpoint:
        """Write the snapshot's state file (atomically); its manifest comes with ``commit``."""
        began = time.perf_counter()
        self.dir.mkdir(exist_ok=True)
        path = self.dir / f"{self.stem(snapshot.rounds_done)}.state"
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as f:
            out = _HashingWriter(f)
            torch.save(snapshot, cast(IO[bytes], out))  # torch.save needs only write (and flush)
            f.flush()
            os.fsync(f.fileno())
        size = tmp.stat().st_size
        if size != out.size:
            raise OSError(f"{tmp} holds {size} bytes after writing {out.size}")
        os.replace(tmp, path)
        _sync_dir(self.dir)
        return PendingCheckpoint(snapshot.rounds_done, path, size, time.perf_counter() - began, out.hexdigest())

    def commit(self, pending: PendingCheckpoint, record_sizes: Mapping[str, int]) -> Path:
        """Write the manifest that makes ``pending`` a checkpoint (the record files must be on disk already), then
        drop all but the last ``keep`` checkpoints."""
        manifest = Manifest(
            pending.rounds_done, pending.path.name, pending.state_bytes, dict(record_sizes), state_sha256=pending.sha256
        )
        path = self.dir / f"{self.stem(pending.rounds_done)}.json"
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w") as f:
            json.dump(asdict(manifest), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _sync_dir(self.dir)
        self._prune()
        return path

    def manifests(self) -> list[Path]:
        """Every manifest, oldest first."""
        if not self.dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.dir.iterdir() if (m := _NAME.fullmatch(p.name))]
        return [p for _, p in sorted(found)]

    def latest(self) -> tuple[Manifest, RunSnapshot] | None:
        """The newest checkpoint that loads (a damaged one is skipped with a warning), or ``None``."""
        for path in reversed(self.manifests()):
            try:
                return self.load(path)
            # Any exception: unpickling damaged bytes raises nearly any type (UnpicklingError, RuntimeError from the
            # zip reader, UnicodeDecodeError, AttributeError, ImportError, ...), and the one before may be sound.
            except Exception as err:
                log.warning(
                    "checkpoint %s cannot be read (%s: %s); trying the one before", path, type(err).__name__, err
                )
        return None

    def load(self, manifest_path: Path) -> tuple[Manifest, RunSnapshot]:
        data: dict[str, Any] = json.loads(manifest_path.read_text())
        manifest = Manifest(**data)
        if manifest.format != _FORMAT:
            raise ValueError(f"checkpoint format {manifest.format}, this rayfl reads {_FORMAT}")
        state_path = self.dir / manifest.state_file
        size = state_path.stat().st_size
        if size != manifest.state_bytes:
            raise ValueError(f"{state_path.name} holds {size} bytes, the manifest says {manifest.state_bytes}")
        raw = state_path.read_bytes()
        if manifest.state_sha256 and hashlib.sha256(raw).hexdigest() != manifest.state_sha256:
            raise ValueError(f"{state_path.name} does not match the manifest's SHA-256 digest (damaged)")
        snapshot = torch.load(io.BytesIO(raw), weights_only=False)  # our own pickle (see module docstring)
        if not isinstance(snapshot, RunSnapshot) or snapshot.rounds_done != manifest.rounds_done:
            raise ValueError(f"{state_path.name} does not hold the snapshot of round {manifest.rounds_done}")
        return manifest, snapshot

    def _prune(self) -> None:
        manifests = self.manifests()
        kept = {p.stem for p in manifests[-self.keep :]}
        for path in manifests[: -self.keep]:
            path.unlink(missing_ok=True)  # the manifest first: a half-removed checkpoint is never read
            (self.dir / f"{path.stem}.state").unlink(missing_ok=True)
        newest = max((int(m.group(1)) for p in manifests if (m := _NAME.fullmatch(p.name))), default=-1)
        for path in self.dir.glob("round-*.state"):  # state files whose manifest never came (a stop in between)
            number = path.stem.removeprefix("round-")
            if path.stem not in kept and number.isdigit() and int(number) < newest:
                path.unlink(missing_ok=True)


class _HashingWriter:
    """A binary file that digests (SHA-256) and counts what goes through it, so a checkpoint is digested as it is
    written rather than read back."""

    def __init__(self, f: io.BufferedWriter) -> None:
        self._f = f
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._hash.update(data)
        self.size += memoryview(data).nbytes
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _sync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (where the platform allows opening a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse fsync on a directory
            os.fsync(fd)
    finally:
        os.close(fd)
