"""Runs on storage by URI (issue 45, item 3), against an S3 emulator each test starts on 127.0.0.1 (moto's server,
``tests/s3_emulator.py``): no mocks, real HTTP to a real server.

* A run with ``output_dir: s3://...`` writes, on the emulator, the files its staging folder holds, byte for byte, and
  the records of the same run written to a local folder (wall-clock columns aside); pruned checkpoints leave the
  bucket too.
* A run on the emulator SIGKILLed mid-run resumes with ``rayfl run --resume s3://...`` from the checkpoint the bucket
  holds, and ends with the records of an uninterrupted local run (its first rounds' rows kept, not rewritten).
* A bucket that does not exist, an endpoint that does not answer and a location that refuses writes are each
  refused in one line naming ``output_dir`` and the URI (credentials masked), before anything is written; so is a
  sweep's ``output_dir`` that cannot be made locally (the README's ``/mnt/shared`` case, here under ``/proc``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rayfl.cli import main
from rayfl.engine.driver import run_experiment
from rayfl.engine.persist.storage import MARKER, download, open_storage
from rayfl.experiment.loader import load_config
from tests.helpers import tiny_yaml
from tests.resume_cases import assert_same_run
from tests.s3_emulator import S3Emulator, read_only_s3

CHECKPOINTS = "checkpoint: {{every: 2, keep: 2}}\ntracking: {{tensorboard: false}}\n"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != MARKER}


def _experiment(tmp_path: Path, output_dir: str, rounds: int) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(tiny_yaml("tiny", rounds, CHECKPOINTS).format(out=output_dir))
    return path


def _cli(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "rayfl.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)


def test_a_run_on_s3_writes_the_files_and_records_of_a_local_run(s3: S3Emulator, tmp_path: Path) -> None:
    exp = _experiment(tmp_path, s3.uri("runs-bucket", "runs"), rounds=6)
    on_s3 = run_experiment(load_config(exp, []))
    local = run_experiment(load_config(exp, [f"output_dir={tmp_path / 'local'}"]))
    assert on_s3.run_dir is not None and local.run_dir is not None
    copy = tmp_path / "copy"
    download(open_storage(s3.uri("runs-bucket", "runs/tiny")), copy)
    assert _files(copy) == _files(on_s3.run_dir)  # the bucket holds the staging folder's files, byte for byte
    assert sorted(_files(copy)) == sorted(_files(local.run_dir))  # the same files as a local run
    # keep: 2 of the checkpoints after rounds 2, 4 and 6: the pruned one left the bucket as well
    assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == [
        "round-000004.json",
        "round-000004.safetensors",
        "round-000006.json",
        "round-000006.safetensors",
    ]
    assert_same_run(local.run_dir, copy, local, on_s3)


def test_a_run_on_s3_killed_mid_run_resumes_from_the_checkpoint_there(s3: S3Emulator, tmp_path: Path) -> None:
    rounds = 40
    exp = _experiment(tmp_path, s3.uri("runs-bucket", "runs"), rounds=rounds)
    fs = s3.filesystem()
    manifest = "runs-bucket/runs/tiny/checkpoints/round-000004.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayfl.cli", "run", str(exp)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        deadline = time.monotonic() + 240
        while fs.get_file_info(manifest).type.name == "NotFound":
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint on the emulator after 240 s"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)  # no chance to write anything more
        proc.communicate(timeout=60)
    before = tmp_path / "before"
    download(open_storage(s3.uri("runs-bucket", "runs/tiny")), before)
    head = (before / "rounds.csv").read_text().splitlines()[:3]  # header, rounds 0-1
    assert not (before / "summary.json").exists()  # killed: it never ended

    resumed = _cli("run", "--resume", s3.uri("runs-bucket", "runs/tiny"))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "rayfl: resuming 'tiny'" in resumed.stdout
    assert f"results: {s3.uri('runs-bucket', 'runs/tiny').replace('rayfltestsecret', '***')}" in resumed.stdout
    after = tmp_path / "after"
    download(open_storage(s3.uri("runs-bucket", "runs/tiny")), after)
    assert (after / "rounds.csv").read_text().splitlines()[:3] == head  # continued from the checkpoint, not restarted
    assert (after / "report.md").is_file()  # the report, written after the run, went to the bucket too
    local = run_experiment(load_config(exp, [f"output_dir={tmp_path / 'local'}"]))
    assert local.run_dir is not None
    assert_same_run(local.run_dir, after)


def _one_line_refusal(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """What ``rayfl ARGS`` prints on stderr, checked to be one line and exit code 2 (the command's own ``main``, in
    this process: a refusal comes before anything imports torch or starts Ray, so a subprocess adds only time)."""
    capsys.readouterr()
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rayfl: error:"), err[-3000:]
    return lines[0]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: nothing listens there


def test_missing_unreachable_and_read_only_storage_are_refused_in_one_line(
    s3: S3Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = s3.uri("no-such-bucket", "runs")
    unreachable = missing.replace(s3.endpoint, f"127.0.0.1:{_closed_port()}")
    lines = {}
    with read_only_s3() as read_only:
        for label, uri in (("missing", missing), ("unreachable", unreachable), ("read-only", read_only)):
            (tmp_path / label).mkdir()
            exp = _experiment(tmp_path / label, uri, rounds=2)
            lines[label] = _one_line_refusal(capsys, "run", str(exp))
            assert "output_dir: cannot write to s3://" in lines[label]
            assert ":***@" in lines[label] and "rayfltestsecret" not in lines[label]  # the secret is masked
    assert "NO_SUCH_BUCKET: The specified bucket does not exist" in lines["missing"]
    assert "NETWORK_CONNECTION" in lines["unreachable"]
    assert "ACCESS_DENIED: Access Denied" in lines["read-only"]
    from pyarrow import fs as pafs

    listed = s3.filesystem().get_file_info(pafs.FileSelector("runs-bucket", recursive=True))
    assert listed == []  # nothing was written anywhere


def test_a_sweep_whose_storage_cannot_be_written_is_refused_in_one_line(
    s3: S3Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = yaml.safe_load(tiny_yaml("tiny", 2).format(out="unused"))
    for label, output_dir in (("local", "/proc/rayfl-sweeps"), ("s3", s3.uri("no-such-bucket", "sweeps"))):
        path = tmp_path / f"{label}.yaml"
        sweep = {"base": base, "param_space": {"seed": [0, 1]}, "output_dir": output_dir}
        path.write_text(f"# rayfl sweep {path}\n" + yaml.safe_dump(sweep, sort_keys=False))
        line = _one_line_refusal(capsys, "sweep", str(path))
        assert f"{path}: output_dir: cannot " in line
    assert not Path("/proc/rayfl-sweeps").exists()
