"""The storage layer (``rayfl/engine/persist/storage.py``): URIs, the refusals' wording, and the staging folder's
copy to a real S3 emulator (``tests/s3_emulator.py``) file by file, manifests last, removals included."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfl.core.errors import ConfigError
from rayfl.core.files import child_uri, is_storage_uri
from rayfl.engine.persist.job_output import JOB_ENV, job_output_dir
from rayfl.engine.persist.storage import MARKER, RunMirror, Storage, is_manifest, storage_reason
from rayfl.experiment.rules import output_dir_problem
from rayfl.tune.cluster import check_trial_node
from tests.s3_emulator import S3Emulator


def test_uris_are_told_from_paths_and_keep_their_query_below() -> None:
    assert is_storage_uri("s3://bucket/runs") and is_storage_uri("gs://bucket")
    assert not is_storage_uri("runs") and not is_storage_uri("/mnt/shared/runs") and not is_storage_uri(Path("x"))
    assert child_uri("s3://b/runs?endpoint_override=h:9000", "sweep", "trials") == (
        "s3://b/runs/sweep/trials?endpoint_override=h:9000"
    )
    assert output_dir_problem("s3://bucket/runs") == ""  # checked by writing to it where the run starts
    assert job_output_dir("s3://bucket/runs", {JOB_ENV: "{}"}) == ("s3://bucket/runs", None)  # outlives a job


def test_credentials_in_a_uri_are_masked_and_the_storage_reason_is_short() -> None:
    shown = Storage("s3://KEY:SECRET@bucket/runs?scheme=http", None, "bucket/runs").shown
    assert shown == "s3://KEY:***@bucket/runs?scheme=http"
    err = OSError(
        "When initiating multiple part upload for key 'runs/p' in bucket 'nob': AWS Error NO_SUCH_BUCKET during "
        "CreateMultipartUpload operation: The specified bucket does not exist (Request ID: 2Bmch)"
    )
    assert storage_reason(err) == "NO_SUCH_BUCKET: The specified bucket does not exist"


def test_checkpoint_manifests_are_told_from_the_files_they_name() -> None:
    names = ["checkpoints/round-000002.json", "rounds.csv", "checkpoints/round-000002.safetensors", "config.yaml"]
    assert [n for n in names if is_manifest(n)] == ["checkpoints/round-000002.json"]  # copied after the others


def test_a_mirror_copies_what_changed_and_removes_what_went(s3: S3Emulator, tmp_path: Path) -> None:
    local = tmp_path / "run"
    (local / "checkpoints").mkdir(parents=True)
    (local / "rounds.csv").write_text("round_idx\n0\n")
    (local / "checkpoints" / "round-000002.json").write_text("{}")
    mirror = RunMirror(local, Storage(s3.uri("runs-bucket", "runs/run"), *_opened(s3, "runs/run")))
    mirror.save()
    mirror.push()
    fs = s3.filesystem()
    assert _read(fs, "runs-bucket/runs/run/rounds.csv") == "round_idx\n0\n"
    assert fs.get_file_info(f"runs-bucket/runs/run/{MARKER}").type.name == "NotFound"  # the staging's own note
    # a later writer of the folder (a resumed run) knows what was copied: nothing unchanged is sent again
    fs.delete_file("runs-bucket/runs/run/rounds.csv")
    again = RunMirror.of(local)
    assert again is not None
    again.push()
    assert fs.get_file_info("runs-bucket/runs/run/rounds.csv").type.name == "NotFound"
    with (local / "rounds.csv").open("a") as f:
        f.write("1\n")
    (local / "checkpoints" / "round-000002.json").unlink()  # pruned
    again.push()
    assert _read(fs, "runs-bucket/runs/run/rounds.csv") == "round_idx\n0\n1\n"
    assert fs.get_file_info("runs-bucket/runs/run/checkpoints/round-000002.json").type.name == "NotFound"
    copy = RunMirror(tmp_path / "copy", again.remote)
    (tmp_path / "copy").mkdir()
    assert copy.pull() == 1 and (tmp_path / "copy" / "rounds.csv").read_text() == "round_idx\n0\n1\n"


def test_a_trial_on_a_node_that_does_not_see_the_sweep_folder_fails_in_one_line(tmp_path: Path) -> None:
    trials = tmp_path / "sweep" / "trials"
    with pytest.raises(ConfigError) as refused:
        check_trial_node(str(trials), "resume.json")
    line = str(refused.value)
    assert "\n" not in line and f"does not see the sweep's folder {tmp_path / 'sweep'}" in line
    assert "output_dir" in line
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "resume.json").write_text("{}")
    check_trial_node(str(trials), "resume.json")  # the node sees it: nothing to say


def _opened(s3: S3Emulator, prefix: str) -> tuple[object, str]:
    return s3.filesystem(), f"runs-bucket/{prefix}"


def _read(fs: object, path: str) -> str:
    with fs.open_input_stream(path) as stream:  # type: ignore[attr-defined]
        return bytes(stream.read()).decode()
