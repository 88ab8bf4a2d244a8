"""A run whose disk fills mid-run (issue 26): one error naming the file and the system's reason, no temporary file left,
record files that agree with each other, and a resume (once there is room) that ends with the records of a run that
never failed. The disk is a real small tmpfs where this machine allows mounting one (root), else the run directory is
made read-only mid-run; rayfl's own writer is never replaced. A full tmpfs stops the run at its next checkpoint (the
record files' appends land in pages they hold already), so a third case makes an append of the record files fail
part-way, through the kernel's file-size limit (``RLIMIT_FSIZE``): the round's rows already appended to other files
are cut again."""

from __future__ import annotations

import dataclasses
import os
import resource
import signal
import subprocess
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pandas as pd
import pytest

from rayfl.cli import EXIT_WRITE_FAILED, main
from rayfl.config.sections import CheckpointConfig, TrackingConfig
from rayfl.engine.driver import run_experiment
from rayfl.engine.persist.records import RoundRecord
from rayfl.engine.persist.write_errors import RunWriteError
from rayfl.experiment.loader import dump_config
from rayfl.experiment.schema import ExperimentConfig
from tests.resume_cases import assert_same_run, case

FILLER = "filler.bin"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path | None]:
    """A fresh 16 MiB tmpfs, or None where none can be mounted (not root)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)], check=False)
        if mounted.returncode == 0:
            try:
                yield mount_point
            finally:
                subprocess.run(["umount", "-l", str(mount_point)], check=False)
            return
    yield None


def _fill(where: Path, leave_bytes: int) -> None:
    """Take all but ``leave_bytes`` of the file system's free space with one file."""
    stats = os.statvfs(where)
    free = stats.f_bavail * stats.f_frsize
    with (where / FILLER).open("wb") as f:
        f.write(b"\0" * max(0, free - leave_bytes))


def _run_dir(output_dir: Path) -> Path:
    (found,) = [p for p in output_dir.iterdir() if p.is_dir()]
    return found


def _break_writes(output_dir: Path, disk: Path | None, leave_bytes: int) -> None:
    if disk is not None:
        _fill(disk, leave_bytes)
    else:  # no tmpfs: the run directory and its checkpoints made read-only (new files fail to appear)
        run_dir = _run_dir(output_dir)
        for path in (run_dir, run_dir / "checkpoints"):
            path.chmod(0o555)


def _mend(output_dir: Path, disk: Path | None) -> None:
    if disk is not None:
        (disk / FILLER).unlink()
    else:
        run_dir = _run_dir(output_dir)
        for path in (run_dir, run_dir / "checkpoints"):
            path.chmod(0o755)


def _after_round(round_idx: int, act: Callable[[], None]) -> Callable[[RoundRecord], None]:
    def callback(record: RoundRecord) -> None:
        if record.round_idx == round_idx:
            act()

    return callback


def _config(output_dir: Path) -> ExperimentConfig:
    cfg = dataclasses.replace(case("fedavg", None, rounds=6), output_dir=str(output_dir))
    # no TensorBoard writer: its own thread would meet the full disk too (and report it as an unhandled exception)
    no_tensorboard = TrackingConfig(tensorboard=False)
    return dataclasses.replace(cfg, checkpoint=CheckpointConfig(every=3, keep=2), tracking=no_tensorboard)


def _assert_consistent(run_dir: Path) -> list[int]:
    """No temporary file, and every record file holds the same whole rounds (Parquet: a prefix of them)."""
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    rounds = pd.read_csv(run_dir / "rounds.csv", keep_default_na=False)
    done = list(rounds["round_idx"])
    assert done == list(range(len(done)))
    clients = pd.read_csv(run_dir / "clients.csv", keep_default_na=False)
    assert sorted(set(clients["round_idx"])) == done  # every round samples clients
    evals = pd.read_csv(run_dir / "evals.csv", keep_default_na=False)
    assert set(evals["round_idx"]) <= set(done)
    for table in ("rounds", "clients"):
        parquet = run_dir / f"{table}.parquet"
        if parquet.exists():
            assert set(pd.read_parquet(parquet)["round_idx"]) <= set(done)
    return done


def _limit_file_size(output_dir: Path) -> None:
    """Writes that would take any file 300 bytes past ``clients.csv``'s present size fail (EFBIG), as on a quota."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error, not the signal that would end the process
    limit = (_run_dir(output_dir) / "clients.csv").stat().st_size + 300
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.fixture
def _file_size_unlimited() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.getsignal(signal.SIGXFSZ)
    yield
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.usefixtures("_file_size_unlimited")
@pytest.mark.parametrize("how", ["2 KiB left", "12 KiB left", "file size limit"])
def test_a_disk_that_fills_mid_run_ends_in_one_line_and_resumes_to_the_same_records(
    disk: Path | None, tmp_path: Path, how: str
) -> None:
    if how != "file size limit" and disk is None and os.geteuid() == 0:
        pytest.skip("root without tmpfs: permissions do not stop root, and no disk can be filled")
    on_disk = disk is not None and how != "file size limit"
    output_dir = disk / "runs" if on_disk and disk is not None else tmp_path / "runs"
    cfg = _config(output_dir)
    whole = run_experiment(dataclasses.replace(cfg, output_dir=str(tmp_path / "whole")))
    assert whole.run_dir is not None
    # broken after round 2, whose checkpoint (after 3 rounds) is the last one that can be written
    if how == "file size limit":
        expected, act = "File too large", partial(_limit_file_size, output_dir)
    else:
        leave = 2048 if how == "2 KiB left" else 12 * 1024
        expected = "No space left on device" if disk is not None else "Permission denied"
        act = partial(_break_writes, output_dir, disk, leave)
    with pytest.raises(RunWriteError) as caught:
        run_experiment(cfg, callbacks=[_after_round(2, act)])
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    run_dir = _run_dir(output_dir)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"cannot write {run_dir}/"), message
    assert expected in message
    if how == "file size limit":  # round 3's rows went to evals.csv and client_accs.csv before clients.csv failed
        assert message.startswith(f"cannot write {run_dir}/clients.csv"), message
    done = _assert_consistent(run_dir)
    assert 3 <= len(done) < cfg.rounds
    if how != "file size limit":
        _mend(output_dir, disk)
    resumed = run_experiment(cfg, resume=run_dir)
    assert_same_run(whole.run_dir, run_dir, whole, resumed)


def test_rayfl_run_on_a_full_disk_exits_5_with_one_line(
    disk: Path | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if disk is None:
        pytest.skip("needs a tmpfs (root)")
    output_dir = disk / "runs"
    output_dir.mkdir()
    config = tmp_path / "run.yaml"
    dump_config(_config(output_dir), config)
    _fill(disk, 2048)
    assert main(["run", str(config)]) == EXIT_WRITE_FAILED
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"rayfl: error: cannot write {output_dir}/") and "No space left on device" in line
    assert not [p for p in output_dir.rglob("*") if p.name.endswith(".tmp")]
