"""``output_dir`` under ``ray job submit`` (``rayfl/engine/persist/job_output.py``): moved out of the job's working
directory, which Ray deletes, and said at start; nothing changes outside a job."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfl.core.errors import ConfigError
from rayfl.engine.persist.job_output import JOB_ENV, ROOT_ENV, job_output_dir

JOB = {JOB_ENV: "{}"}
# a job's working directory as Ray unpacks it: under a session folder's runtime_resources (any root will do)
CACHE = Path("ray/session_2026-11-27_05-00-00_1_2/runtime_resources/working_dir_files/_ray_pkg_ab")


def test_outside_a_job_output_dir_is_used_as_given() -> None:
    assert job_output_dir("runs", {}) == ("runs", None)


def test_a_relative_output_dir_under_a_job_goes_to_the_root(tmp_path: Path) -> None:
    out, note = job_output_dir("runs", {**JOB, ROOT_ENV: str(tmp_path)})
    assert out == str(tmp_path / "runs")
    assert note is not None and f"${ROOT_ENV}, to {tmp_path / 'runs'}" in note
    out, note = job_output_dir("runs/x", JOB)
    assert out == str(Path("~/rayfl-runs/runs/x").expanduser()) and note is not None and "~/rayfl-runs" in note


def test_absolute_output_dirs_stay_unless_inside_rays_session_folder(tmp_path: Path) -> None:
    assert job_output_dir(str(tmp_path), JOB) == (str(tmp_path), None)
    with pytest.raises(ConfigError, match="inside Ray's session folder"):
        job_output_dir(str(tmp_path / CACHE / "runs"), JOB)
    with pytest.raises(ConfigError, match="must be an absolute path"):
        job_output_dir("runs", {**JOB, ROOT_ENV: "relative/root"})
