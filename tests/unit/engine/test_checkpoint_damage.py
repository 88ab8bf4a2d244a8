"""Damaged and hostile checkpoints (issue 26): whatever is done to the newest checkpoint's files (cut short, a bit
flipped, a JSON value of the wrong type, a pickle planted under a checkpoint's name), resuming either refuses in one
line or falls back to the checkpoint before it, and never runs code from the run directory."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import pickle
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayfl.core.errors import ConfigError
from rayfl.engine.driver import run_experiment
from rayfl.engine.persist import snapshot_codec
from rayfl.engine.persist.checkpoint import CheckpointStore, RunSnapshot
from rayfl.engine.persist.resume import load_resume_point
from rayfl.experiment.schema import ExperimentConfig
from tests.resume_cases import assert_same_object, case

NEWEST = "round-000003"


class _WritesAFile:
    """A pickle payload: unpickling it writes ``marker`` (what a hostile run directory could do with ``torch.load``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Path.write_text, (self.marker, "code from the run directory ran")


@dataclasses.dataclass(frozen=True)
class Written:
    cfg: ExperimentConfig
    run_dir: Path
    newest: RunSnapshot


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    out = tmp_path_factory.mktemp("damage")
    cfg = dataclasses.replace(case("fedavg", None, rounds=3), output_dir=str(out))  # checkpoints after rounds 1..3
    result = run_experiment(cfg)
    assert result.run_dir is not None
    found = CheckpointStore(result.run_dir, keep=1).latest()
    assert found is not None and found[1].rounds_done == 3
    return Written(cfg, result.run_dir, found[1])


@contextlib.contextmanager
def _copy(run_dir: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run"
        shutil.copytree(run_dir, copy)
        yield copy


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_manifest(path: Path, body: dict[str, Any]) -> None:
    """A manifest with ``body`` and its own digest made to match (so that the checks behind the digest are reached)."""
    body = {k: v for k, v in body.items() if k != "manifest_sha256"}
    path.write_text(json.dumps({**body, "manifest_sha256": _digest(json.dumps(body, sort_keys=True).encode())}))


def _set_state(checkpoints: Path, raw: bytes, name: str = f"{NEWEST}.safetensors") -> None:
    """``raw`` as the newest checkpoint's state file, its manifest's size and digest made to match."""
    (checkpoints / name).write_bytes(raw)
    manifest = checkpoints / f"{NEWEST}.json"
    body = json.loads(manifest.read_text())
    _write_manifest(manifest, {**body, "state_file": name, "state_bytes": len(raw), "state_sha256": _digest(raw)})


def _tree(raw: bytes) -> tuple[dict[str, Any], Any, int]:
    """The safetensors header, the snapshot's JSON tree in it, and where the tensor bytes start."""
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    return header, json.loads(header["__metadata__"]["rayfl.snapshot"]), 8 + size


def _with_tree(raw: bytes, tree: Any) -> bytes:
    header, _, start = _tree(raw)
    header["__metadata__"]["rayfl.snapshot"] = json.dumps(tree)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads its header to 8 bytes
    return struct.pack("<Q", len(text)) + text + raw[start:]


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON value, but ``None`` (declared optional where it stands: any value of the declared type
    fits there, so no type is wrong for it)."""
    if value is None:
        return
    if at:
        yield at
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*at, key))
    elif isinstance(value, list):
        for k, item in enumerate(value):
            yield from _paths(item, (*at, k))


def _kind(value: Any) -> str:
    return "number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__


def _replace(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[at[0]] = _replace(value[at[0]], at[1:], new)
    return copy


def _get(value: Any, at: tuple[Any, ...]) -> Any:
    for key in at:
        value = value[key]
    return value


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**9),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
)


@st.composite
def damages(draw: st.DrawFn) -> tuple[str, Any]:
    """One damage to the newest checkpoint: ``(kind, how)``."""
    kind = draw(st.sampled_from(["truncate", "flip", "wrong_type", "pickle"]))
    if kind == "truncate":
        return kind, (draw(st.sampled_from(["state", "manifest"])), draw(st.floats(0, 1, exclude_max=True)))
    if kind == "flip":
        return kind, (draw(st.sampled_from(["state", "manifest"])), draw(st.floats(0, 1, exclude_max=True)),
                      draw(st.integers(0, 7)))  # fmt: skip
    if kind == "wrong_type":
        return kind, (draw(st.sampled_from(["tree", "manifest"])), draw(st.integers(0, 10**6)), draw(JSON_VALUES))
    return kind, draw(st.sampled_from(["safetensors name", "old format", "torch.save under the new name"]))


def _apply(kind: str, how: Any, checkpoints: Path, marker: Path) -> bool:
    """Damage the newest checkpoint; False when the damage drawn does not apply (a value of the same type)."""
    state, manifest = checkpoints / f"{NEWEST}.safetensors", checkpoints / f"{NEWEST}.json"
    if kind in ("truncate", "flip"):
        path = state if how[0] == "state" else manifest
        raw = bytearray(path.read_bytes())
        at = int(how[1] * len(raw))
        if kind == "truncate":
            del raw[at:]
        else:
            raw[at] ^= 1 << how[2]
        path.write_bytes(bytes(raw))
        return True
    if kind == "wrong_type":
        where, pick, new = how
        if where == "tree":
            raw = state.read_bytes()
            tree = _tree(raw)[1]
        else:
            tree = {k: v for k, v in json.loads(manifest.read_text()).items() if k != "manifest_sha256"}
        places = list(_paths(tree))
        place = places[pick % len(places)]
        if _kind(_get(tree, place)) == _kind(new):
            return False
        if where == "tree":
            _set_state(checkpoints, _with_tree(raw, _replace(tree, place, new)))
        else:
            _write_manifest(manifest, _replace(tree, place, new))
        return True
    payload = _WritesAFile(marker)
    if how == "safetensors name":
        _set_state(checkpoints, pickle.dumps(payload))
    elif how == "torch.save under the new name":
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        _set_state(checkpoints, buffer.getvalue())
    else:  # as a rayfl before this format wrote it: a pickle and a format-1 manifest naming it
        raw = pickle.dumps(payload)
        (checkpoints / f"{NEWEST}.state").write_bytes(raw)
        body = json.loads(manifest.read_text())
        _write_manifest(manifest, {**body, "format": 1, "state_file": f"{NEWEST}.state", "state_bytes": len(raw),
                                   "state_sha256": _digest(raw)})  # fmt: skip
    return True


def test_the_planted_payload_is_live(tmp_path: Path) -> None:
    """The payload the damage test plants does write its file when unpickled: its not running there means something."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(_WritesAFile(marker)))  # the point of the test
    assert marker.read_text() == "code from the run directory ran"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=damages())
def test_a_damaged_newest_checkpoint_is_refused_in_one_line_or_the_one_before_is_used(
    written: Written, damage: tuple[str, Any]
) -> None:
    kind, how = damage
    with _copy(written.run_dir) as run_dir:
        marker = run_dir.parent / "ran"
        if not _apply(kind, how, run_dir / "checkpoints", marker):
            return
        try:
            point = load_resume_point(written.cfg, run_dir)
        except ConfigError as err:
            assert "\n" not in str(err) and str(err).startswith(str(run_dir))
            if kind == "pickle" and how == "old format":
                assert "is a checkpoint of an older rayfl" in str(err)
        else:
            assert not (kind == "pickle" and how == "old format")
            if point.snapshot.rounds_done == 3:  # damage the format does not see (JSON whitespace): the same snapshot
                assert_same_object(point.snapshot, written.newest, "snapshot")
            else:
                assert point.snapshot.rounds_done == 2
        assert not marker.exists()


def test_an_old_pickled_checkpoint_is_refused_in_one_line_without_being_read(
    written: Written, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rayfl.cli import main

    with _copy(written.run_dir) as run_dir:
        marker = tmp_path / "ran"
        _apply("pickle", "old format", run_dir / "checkpoints", marker)
        # a run that was stopped before its last round (a finished one is not resumed at all: nothing to do)
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}), encoding="utf-8")
        assert main(["run", "--resume", str(run_dir)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "round-000003.json: is a checkpoint of an older rayfl (a pickle, format 1)" in line
        assert not marker.exists()


def test_the_codec_keeps_every_kind_of_value_exactly() -> None:
    shared = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    value = {
        "floats": [0.1, -0.0, float("inf"), float("nan")],
        (1, "a"): frozenset({3, 4}),
        "tensors": (shared, shared, shared[:, 1], torch.zeros(0, dtype=torch.float16), torch.tensor(True)),
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "arrays": [np.arange(4, dtype=np.uint64), np.array(["ab", "c"]), np.zeros((0, 3)), np.float32(1.5)],
        "objects": np.array([None, (1, 2)], dtype=object),
        "generator": np.random.default_rng(3),
        "dtype": torch.float16,
        "bytes": b"\x00\xff",
        "snapshot_part": RunSnapshot(0, snapshot_codec_state(), 1.5, {}, {}, (0.5, 0.25, 7), 0, 2.0),
    }
    back = snapshot_codec.decode(snapshot_codec.encode(value))
    assert isinstance(back, dict)
    assert_same_object({k: v for k, v in back.items() if k != "generator"},
                       {k: v for k, v in value.items() if k != "generator"}, "value")  # fmt: skip
    assert back["tensors"][0] is back["tensors"][1]  # one tensor twice is one tensor again, as pickle kept it
    assert back["generator"].random() == np.random.default_rng(3).random()
    assert isinstance(back["parameter"], torch.nn.Parameter)


def test_the_codec_refuses_what_it_cannot_keep_when_writing() -> None:
    with pytest.raises(snapshot_codec.SnapshotFormatError, match=r"cannot keep the object at snapshot\[0\]"):
        snapshot_codec.encode([object()])
    with pytest.raises(snapshot_codec.SnapshotFormatError, match=r"cannot keep the \w*Path at snapshot\[.where.\]"):
        snapshot_codec.encode({"where": Path("x")})


def snapshot_codec_state() -> Any:
    from rayfl.core.messages import ServerState

    return ServerState({"w": torch.ones(2)}, round_idx=1)


def test_a_checkpoint_written_before_a_field_existed_reads_with_the_fields_default() -> None:
    """A snapshot of an earlier rayfl lacks fields added since (``RunSnapshot.policy_state``, ``initial_params``):
    they take their defaults; a field the class does not have is still refused (nothing is built from it)."""
    import safetensors.torch

    from rayfl.core.messages import ServerState
    from rayfl.engine.persist import snapshot_codec
    from rayfl.engine.persist.checkpoint import RunSnapshot

    snap = RunSnapshot(
        rounds_done=2,
        state=ServerState(params={"w": torch.ones(2)}),
        sim_time_s=1.5,
        client_states={},
        phase_results={},
        last_eval=(0.5, 1.0, 10),
        nonfinite_streak=0,
        wall_time_s=3.0,
        initial_params={"w": torch.zeros(2)},
        policy_state={"serial": 3},
    )
    raw = snapshot_codec.encode(snap)

    def rewritten(edit: Any) -> bytes:
        (size,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + size])
        tree = json.loads(header["__metadata__"]["rayfl.snapshot"])
        edit(tree["fields"])
        tensors = safetensors.torch.load(raw)
        return safetensors.torch.save(tensors, metadata={"rayfl.snapshot": json.dumps(tree)})

    old = snapshot_codec.decode(rewritten(lambda f: [f.pop("policy_state"), f.pop("initial_params")]))
    assert isinstance(old, RunSnapshot) and old.policy_state is None and old.initial_params == {}
    assert old.rounds_done == 2 and torch.equal(old.state.params["w"], torch.ones(2))
    with pytest.raises(snapshot_codec.SnapshotFormatError, match="RunSnapshot has"):
        snapshot_codec.decode(rewritten(lambda f: f.update(unknown=f["rounds_done"])))
