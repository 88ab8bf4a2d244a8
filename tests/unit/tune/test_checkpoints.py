"""Tune's markers of a trial's checkpoints (``rayfl/tune/checkpoints.py``): a marker holds the names of a
checkpoint of the trial's run directory and nothing else (no pickle, no copy), a hostile one names no file outside a
checkpoint (issue 26), and a restored trial resumes from its run directory's newest checkpoint even when Tune's state
names one the run has pruned since (what a driver killed between two of Tune's state saves leaves)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
from pathlib import Path

import pytest

from rayfl.config.sections import CheckpointConfig
from rayfl.engine.driver import run_experiment
from rayfl.engine.persist.checkpoint import CheckpointRefused, CheckpointStore
from rayfl.engine.persist.records import read_round_records
from rayfl.tune.checkpoints import pack, restore_into
from tests.resume_cases import case


def _run(tmp_path: Path, keep: int) -> Path:
    checkpoint = CheckpointConfig(every=1, keep=keep)
    cfg = dataclasses.replace(case("fedavg", None, rounds=4), output_dir=str(tmp_path / "runs"), checkpoint=checkpoint)
    result = run_experiment(cfg)
    assert result.run_dir is not None
    # the rows read back as they were kept (``repr``: NaN equal to NaN, every float to the last bit)
    assert [repr(r) for r in read_round_records(result.run_dir)] == [repr(r) for r in result.records]
    return result.run_dir


def _marker(run_dir: Path, rounds_done: int, where: Path) -> Path:
    where.mkdir(parents=True)
    return pack(run_dir, rounds_done, where)


def test_a_marker_names_the_run_directorys_checkpoint_and_a_restore_resumes_from_the_newest(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, keep=2)  # rounds 3 and 4 kept
    newest = _marker(run_dir, 4, tmp_path / "m4")
    assert [p.name for p in newest.iterdir()] == ["rayfl.json"]
    assert json.loads((newest / "rayfl.json").read_text()) == {
        "manifest": "round-000004.json",
        "state": "round-000004.safetensors",
    }
    with pytest.raises(FileNotFoundError, match=r"round-000001\.json"):
        _marker(run_dir, 1, tmp_path / "m1")  # pruned: never a marker of a checkpoint that is not there

    info = restore_into(newest, run_dir)
    assert (info.manifest, info.resumes_from) == ("round-000004.json", "round-000004.json")
    # Tune's state saved when round 2's checkpoint was its last: the run went on and pruned it; the trial resumes
    # from the newest the run directory holds, and nothing is removed
    stale = tmp_path / "m2"
    stale.mkdir()
    names = {"manifest": "round-000002.json", "state": "round-000002.safetensors"}
    (stale / "rayfl.json").write_text(json.dumps(names))
    info = restore_into(stale, run_dir)
    assert (info.manifest, info.resumes_from) == ("round-000002.json", "round-000004.json")
    assert [p.name for p in CheckpointStore(run_dir, keep=1).manifests()] == ["round-000003.json", "round-000004.json"]

    shutil.rmtree(run_dir / "checkpoints")
    with pytest.raises(ValueError, match="holds no checkpoint"):
        restore_into(newest, run_dir)


def test_an_earlier_rayfls_copy_restores_and_a_hostile_or_pickled_marker_is_refused(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, keep=1000)
    earlier = tmp_path / "earlier"  # what an earlier rayfl reported: the checkpoint's files beside its rayfl.json
    earlier.mkdir()
    for name in ("round-000001.json", "round-000001.safetensors"):
        shutil.copyfile(run_dir / "checkpoints" / name, earlier / name)
    good = {"manifest": "round-000001.json", "state": "round-000001.safetensors", "carried": {"test_acc": 0.5}}
    (earlier / "rayfl.json").write_text(json.dumps(good))
    assert all(not p.read_bytes().startswith(b"\x80") for p in earlier.iterdir())  # no pickle protocol header
    target = tmp_path / "trial"
    info = restore_into(earlier, target)
    assert info.resumes_from == "round-000001.json"
    found = CheckpointStore(target, keep=1).latest()
    assert found is not None and found[1].rounds_done == 1

    info_path = earlier / "rayfl.json"
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the run directory")
    for hostile in (
        {**good, "state": "../../secret.txt"},
        {**good, "manifest": "round-000002.json"},  # not the state file's manifest
        {**good, "extra": "x"},
        [1, 2],
    ):
        info_path.write_text(json.dumps(hostile))
        with pytest.raises(ValueError, match=str(info_path)):
            restore_into(earlier, tmp_path / "other")
    assert not (tmp_path / "other" / "checkpoints" / "secret.txt").exists()

    marker = tmp_path / "ran"
    (earlier / "round-000001.state").write_bytes(pickle.dumps(_WritesAFile(marker)))
    info_path.write_text(json.dumps({**good, "state": "round-000001.state"}))  # as the pickled format named it
    with pytest.raises(CheckpointRefused, match="trial checkpoint of an older rayfl"):
        restore_into(earlier, tmp_path / "old")
    assert not marker.exists()


class _WritesAFile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return Path.write_text, (self.marker, "ran")
