"""The command line, end to end on a tiny synthetic experiment (real files, real training, in-process backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rayfl.cli import main

TINY = """\
# rayfl run {path}
name: cli-tiny
rounds: 3
clients_per_round: 4
output_dir: {out}
data: {{name: synthetic, partition: iid, num_clients: 8, synthetic_samples: 16}}
model: {{name: cnn, channels: [4, 8]}}
train: {{lr: 0.05, batch_size: 8}}
backend: {{kind: local, num_hosts: 2}}
"""


def _write(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.format(path=path, out=tmp_path / "runs"))
    return path


def test_run_writes_records_config_summary_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path)
    assert main(["run", str(path), "rounds=4"]) == 0
    out = capsys.readouterr().out
    assert "final test accuracy" in out and "baseline" in out
    run_dir = tmp_path / "runs" / "cli-tiny"
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert list(rounds["round_idx"]) == [0, 1, 2, 3]  # the override took effect
    assert len(pd.read_csv(run_dir / "rounds.csv")) == 4
    assert "rounds: 4" in (run_dir / "config.yaml").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 4 and 0.0 <= summary["final_test_acc"] <= 1.0
    assert (run_dir / "accuracy_vs_rounds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second run never overwrites the first
    assert main(["run", str(path)]) == 0
    assert (tmp_path / "runs" / "cli-tiny-1" / "summary.json").exists()
    assert main(["report", str(run_dir), str(tmp_path / "runs" / "cli-tiny-1")]) == 0
    assert "cli-tiny" in capsys.readouterr().out


def test_validate_reports_key_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path)
    assert main(["validate", str(path)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("train: {lr: 0.05", "train: {lr: -1"))
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:8" in err and "train.lr" in err
    assert main(["run", str(path), "train.lrr=0.1"]) == 2
    assert "train.lrr" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before anything ran or was written


def test_embedded_default_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "rounds=2"]) == 0
    assert "OK" in capsys.readouterr().out
