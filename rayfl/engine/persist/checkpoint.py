"""Checkpoints: everything the rounds after a round depend on, so that a resumed run continues bit for bit.

What a checkpoint after ``n`` finished rounds holds (``RunSnapshot``):

* ``state``: the ``ServerState``: every global model's parameters and architecture, the server optimizer's state and
  the algorithm's own state (model search's pool, FedorAS's tiers and search populations);
* ``client_states``: every client's memory (padding models, per-client algorithm state, kept uploads), written
  beside the snapshot in part files of at most ``CLIENT_BATCH`` clients each (``client_parts``: each file's name, size
  and SHA-256 digest; the snapshot itself is checked against the manifest, so the parts are too). The backend hands
  them over batch by batch (``Backend.client_state_batches``): on Ray from the hosts' state stores, so the driver
  never holds every client's memory at once (issue 32, finding 3). A checkpoint written before the parts holds them
  in the snapshot itself and still loads;
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

* ``round-000012.safetensors``: the snapshot (``snapshot_codec.py``): its tensors in a safetensors file, everything
  else a JSON tree in that file's header. Nothing in it is pickled, so reading a checkpoint runs no code from the run
  directory (a colleague's results, a sweep copied off a cluster). It is written before the round's records so that
  its size and write time can go in the round's record (``checkpoint_bytes``, ``checkpoint_s``);
* ``round-000012.json``: the manifest (rounds done, the state file's name, size and SHA-256 digest, the record files'
  lengths, and a digest of the manifest itself), written after the round's records. A checkpoint exists once its
  manifest does.

Both are written to a temporary file, flushed to disk (``fsync``) and renamed over the final name, and the record files
are flushed to disk before the manifest names their lengths, so a crash at any point leaves either the previous
checkpoint or the new one. The last ``keep`` checkpoints are kept. A checkpoint whose manifest or state file is
damaged (a size or digest that differs, a value of the wrong type, bytes that are not a snapshot) is skipped with a
warning and the checkpoint before it is used. A checkpoint of a rayfl before this format (a ``torch.save`` pickle,
manifest format 1) is refused in one line (``CheckpointRefused``) and never unpickled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rayfl.core.messages import Params, ServerState
from rayfl.engine.persist import snapshot_codec
from rayfl.engine.persist.write_errors import writing

__all__ = [
    "CHECKPOINT_DIR",
    "CLIENT_BATCH",
    "CheckpointRefused",
    "CheckpointStore",
    "ClientPart",
    "Manifest",
    "PendingCheckpoint",
    "RunSnapshot",
]

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
_FORMAT = 2  # 1: a torch.save pickle (refused); 2: safetensors with a JSON tree
_STATE_SUFFIX = ".safetensors"
_NAME = re.compile(r"round-(\d{6,})\.json")
_STATE_NAME = re.compile(r"round-(\d{6,})(\.clients-\d{4,})?\.safetensors")  # a state file or a client part
CLIENT_BATCH = 256  # clients per part file: what the driver holds of the client memories at once while writing
_TABLE = re.compile(r"[a-z_]+")


class CheckpointRefused(ValueError):
    """A checkpoint this rayfl will not read at all (not a damaged one, which is skipped): one line saying why."""

    def __init__(self, reason: str, path: Path) -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True)
class ClientPart:
    """One part file of a checkpoint's client memories: its name (beside the state file), how many clients it holds,
    its size and SHA-256 digest."""

    file: str
    clients: int
    bytes: int
    sha256: str


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
    # the round policy's state (an asynchronous run's clients in flight, their uploads, the start counter)
    policy_state: object | None = None
    # the part files holding ``client_states`` (written by ``write_state``, read back into it by ``load``)
    client_parts: tuple[ClientPart, ...] = ()


@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint: its state file and the record files' lengths when it was taken."""

    rounds_done: int
    state_file: str
    state_bytes: int
    record_sizes: dict[str, int]
    format: int = _FORMAT
    state_sha256: str = ""


@dataclass(frozen=True)
class PendingCheckpoint:
    """A state file written and not yet committed (its manifest follows the round's records)."""

    rounds_done: int
    path: Path
    state_bytes: int
    write_s: float
    sha256: str = ""
    parts_bytes: int = 0  # the client part files' bytes beside the state file's

    @property
    def total_bytes(self) -> int:
        """Bytes the checkpoint's state written (state file and client parts)."""
        return self.state_bytes + self.parts_bytes


class CheckpointStore:
    """The checkpoints of one run directory: write, commit, prune, find the newest that loads."""

    def __init__(self, run_dir: Path, keep: int) -> None:
        self.dir = run_dir / CHECKPOINT_DIR
        self.keep = max(1, int(keep))

    @staticmethod
    def stem(rounds_done: int) -> str:
        return f"round-{rounds_done:06d}"

    def write_state(
        self, snapshot: RunSnapshot, client_batches: Iterable[Mapping[int, object]] = ()
    ) -> PendingCheckpoint:
        """Write the snapshot's state file (atomically), and first ``client_batches`` (the clients' memories, batch by
        batch) as its client part files, each encoded and written before the next batch is asked for; the manifest
        comes with ``commit``."""
        began = time.perf_counter()
        with writing(self.dir):
            self.dir.mkdir(exist_ok=True)
        parts = [self._write_part(snapshot.rounds_done, k, batch) for k, batch in enumerate(client_batches) if batch]
        if parts:
            snapshot = dataclasses.replace(snapshot, client_parts=(*snapshot.client_parts, *parts))
        raw = snapshot_codec.encode(snapshot)
        path = self.dir / f"{self.stem(snapshot.rounds_done)}{_STATE_SUFFIX}"
        _write_atomically(path, raw)
        _sync_dir(self.dir)
        digest = hashlib.sha256(raw).hexdigest()
        took = time.perf_counter() - began
        return PendingCheckpoint(snapshot.rounds_done, path, len(raw), took, digest, sum(p.bytes for p in parts))

    def _write_part(self, rounds_done: int, index: int, batch: Mapping[int, object]) -> ClientPart:
        """One batch of client memories as a part file (atomically, not yet synced with the directory)."""
        raw = snapshot_codec.encode(dict(batch))
        path = self.dir / f"{self.stem(rounds_done)}.clients-{index:04d}{_STATE_SUFFIX}"
        _write_atomically(path, raw)
        return ClientPart(path.name, len(batch), len(raw), hashlib.sha256(raw).hexdigest())

    def _read_parts(self, snapshot: RunSnapshot) -> RunSnapshot:
        """``snapshot`` with the client memories of its part files in ``client_states`` (each file checked against
        the size and digest the snapshot names)."""
        if not snapshot.client_parts:
            return snapshot
        states = dict(snapshot.client_states)
        prefix = f"{self.stem(snapshot.rounds_done)}.clients-"
        for part in snapshot.client_parts:
            if not (part.file.startswith(prefix) and part.file.endswith(_STATE_SUFFIX)) or "/" in part.file:
                raise ValueError(f"the snapshot of round {snapshot.rounds_done} names a client part {part.file!r}")
            raw = (self.dir / part.file).read_bytes()
            if len(raw) != part.bytes or hashlib.sha256(raw).hexdigest() != part.sha256:
                raise ValueError(f"{part.file} does not match the size and SHA-256 digest its snapshot names (damaged)")
            try:
                batch = snapshot_codec.decode(raw)
            except snapshot_codec.SnapshotFormatError as err:
                raise ValueError(f"{part.file}: {err}") from err
            if not isinstance(batch, dict) or len(batch) != part.clients or not all(type(c) is int for c in batch):
                raise ValueError(f"{part.file} does not hold the memories of {part.clients} clients")
            states.update(batch)
        return dataclasses.replace(snapshot, client_states=states, client_parts=())

    def commit(self, pending: PendingCheckpoint, record_sizes: Mapping[str, int]) -> Path:
        """Write the manifest that makes ``pending`` a checkpoint (the record files must be on disk already), then
        drop all but the last ``keep`` checkpoints."""
        manifest = Manifest(
            pending.rounds_done, pending.path.name, pending.state_bytes, dict(record_sizes), state_sha256=pending.sha256
        )
        path = self.dir / f"{self.stem(pending.rounds_done)}.json"
        body = asdict(manifest)
        text = json.dumps({**body, "manifest_sha256": _digest_of(body)}, indent=2)
        try:
            _write_atomically(path, text.encode())
        except BaseException:
            pending.path.unlink(missing_ok=True)  # never a checkpoint: the one before stays the newest
            raise
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
        """The newest checkpoint that loads (a damaged one is skipped with a warning), or ``None``;
        ``CheckpointRefused`` when the newest is one this rayfl does not read (the pickled format)."""
        for path in reversed(self.manifests()):
            try:
                return self.load(path)
            except CheckpointRefused:
                raise
            # Whatever the damage, the reading builds only data (JSON, safetensors): a ValueError from the checks or
            # the parsers, an OSError for a missing or unreadable file. The one before may be sound.
            except (ValueError, OSError) as err:
                log.warning("checkpoint %s cannot be read (%s); trying the one before", path, err)
        return None

    def load(self, manifest_path: Path) -> tuple[Manifest, RunSnapshot]:
        """The checkpoint whose manifest is ``manifest_path``, every file checked against the manifest first."""
        manifest = _read_manifest(manifest_path)
        state_path = self.dir / manifest.state_file
        size = state_path.stat().st_size
        if size != manifest.state_bytes:
            raise ValueError(f"{state_path.name} holds {size} bytes, the manifest says {manifest.state_bytes}")
        raw = state_path.read_bytes()
        if hashlib.sha256(raw).hexdigest() != manifest.state_sha256:
            raise ValueError(f"{state_path.name} does not match the manifest's SHA-256 digest (damaged)")
        try:
            snapshot = snapshot_codec.decode(raw)
        except snapshot_codec.SnapshotFormatError as err:
            raise ValueError(f"{state_path.name}: {err}") from err
        if not isinstance(snapshot, RunSnapshot) or snapshot.rounds_done != manifest.rounds_done:
            raise ValueError(f"{state_path.name} does not hold the snapshot of round {manifest.rounds_done}")
        return manifest, self._read_parts(snapshot)

    def _prune(self) -> None:
        manifests = self.manifests()
        kept = {p.stem for p in manifests[-self.keep :]}
        for path in manifests[: -self.keep]:
            path.unlink(missing_ok=True)  # the manifest first: a half-removed checkpoint is never read
            (self.dir / f"{path.stem}.state").unlink(missing_ok=True)
        newest = max((int(m.group(1)) for p in manifests if (m := _NAME.fullmatch(p.name))), default=-1)
        # state files (and client parts) of pruned checkpoints and of those whose manifest never came (a stop)
        for path in self.dir.glob(f"round-*{_STATE_SUFFIX}"):
            found = _STATE_NAME.fullmatch(path.name)
            if found and f"round-{found.group(1)}" not in kept and int(found.group(1)) < newest:
                path.unlink(missing_ok=True)


def _read_manifest(path: Path) -> Manifest:
    """A manifest, every field checked: its own digest, types, and a state file beside it named after it."""
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path.name} is not JSON ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} is not a checkpoint manifest")
    old_format, old_state = data.get("format", 1), data.get("state_file")
    if type(old_format) is int and old_format == 1 and type(old_state) is str and old_state.endswith(".state"):
        raise CheckpointRefused(
            "is a checkpoint of an older rayfl (a pickle, format 1), which this rayfl does not load because "
            "unpickling can run code: start the run again, or resume it with the rayfl that wrote it",
            path,
        )
    body = {k: v for k, v in data.items() if k != "manifest_sha256"}
    if data.get("manifest_sha256") != _digest_of(body):
        raise ValueError(f"{path.name} does not match its own SHA-256 digest (damaged)")
    kinds = {"rounds_done": int, "state_file": str, "state_bytes": int, "record_sizes": dict, "format": int,
             "state_sha256": str}  # fmt: skip
    if set(body) != set(kinds) or any(type(body[k]) is not kind for k, kind in kinds.items()):
        wanted = ", ".join(f"{k}: {v.__name__}" for k, v in kinds.items())
        raise ValueError(f"{path.name}: its fields are not a manifest's ({wanted})")
    manifest = Manifest(**body)
    if manifest.format != _FORMAT:
        raise CheckpointRefused(f"has checkpoint format {manifest.format}; this rayfl reads {_FORMAT}", path)
    if manifest.state_file != f"{path.stem}{_STATE_SUFFIX}" or manifest.rounds_done != int(path.stem[6:]):
        raise ValueError(f"{path.name} names {manifest.state_file!r} after {manifest.rounds_done} rounds")
    sizes = manifest.record_sizes
    if not all(_TABLE.fullmatch(k) and type(v) is int and v >= 0 for k, v in sizes.items()):
        raise ValueError(f"{path.name}: record_sizes is not a table -> byte count map")
    return manifest


def _digest_of(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _write_atomically(path: Path, data: bytes) -> None:
    """``data`` as ``path``: a temporary file beside it, flushed to disk, renamed over it; on an error (a full disk)
    the temporary file is removed and the error raised."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with writing(path), tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with writing(path):
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
