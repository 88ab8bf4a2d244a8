"""Tune's copies of a trial's checkpoints (``rayfl/tune/checkpoints.py``) hold no pickle, and a hostile ``rayfl.json``
names no file outside the checkpoint (issue 26)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
from pathlib import Path

import pytest

from rayfl.engine.driver import run_experiment
from rayfl.engine.persist.checkpoint import CheckpointRefused, CheckpointStore
from rayfl.tune.checkpoints import pack, restore_into
from tests.resume_cases import case


def test_a_packed_checkpoint_restores_and_a_hostile_or_old_one_is_refused(tmp_path: Path) -> None:
    cfg = dataclasses.replace(case("fedavg", None, rounds=2), output_dir=str(tmp_path / "runs"))
    result = run_experiment(cfg)
    assert result.run_dir is not None
    (tmp_path / "tune").mkdir()
    packed = pack(result.run_dir, 1, tmp_path / "tune", {"test_acc": 0.5})
    assert sorted(p.name for p in packed.iterdir()) == ["rayfl.json", "round-000001.json", "round-000001.safetensors"]
    assert all(not p.read_bytes().startswith(b"\x80") for p in packed.iterdir())  # no pickle protocol header
    target = tmp_path / "trial"
    info = restore_into(packed, target)
    assert info.carried == {"test_acc": 0.5}
    found = CheckpointStore(target, keep=1).latest()
    assert found is not None and found[1].rounds_done == 1

    info_path = packed / "rayfl.json"
    good = json.loads(info_path.read_text())
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the run directory")
    for hostile in (
        {**good, "state": "../../secret.txt"},
        {**good, "manifest": "round-000002.json"},  # not the state file's manifest
        {**good, "carried": "x"},
        [1, 2],
    ):
        info_path.write_text(json.dumps(hostile))
        with pytest.raises(ValueError, match=str(info_path)):
            restore_into(packed, tmp_path / "other")
    assert not (tmp_path / "other" / "checkpoints" / "secret.txt").exists()

    marker = tmp_path / "ran"
    (packed / "round-000001.state").write_bytes(pickle.dumps(_WritesAFile(marker)))
    info_path.write_text(json.dumps({**good, "state": "round-000001.state"}))  # as the pickled format named it
    with pytest.raises(CheckpointRefused, match="trial checkpoint of an older rayfl"):
        restore_into(packed, tmp_path / "old")
    assert not marker.exists()
    shutil.rmtree(packed)


class _WritesAFile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return Path.write_text, (self.marker, "ran")
