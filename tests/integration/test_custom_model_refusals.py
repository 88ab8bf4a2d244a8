"""One's own 10-line model on the embedded default: whatever ``rayfl run`` would refuse about it, ``rayfl validate``
refuses too, and ``run`` refuses before Ray starts or a run directory exists (one line, exit 2): the default's
``train.sequence_loss: all`` that its forward cannot serve (with the fix in the line), and a sub-model method."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfl.cli import main

MODEL = """\
from torch import nn


class Tiny(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.embed = nn.Embedding(num_classes, 8)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.embed(x[:, -1]))


def tiny(num_classes):
    return Tiny(num_classes)
"""


@pytest.fixture
def custom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    (tmp_path / "mymodels_31.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)  # factories resolve from the working directory first
    return ["model.name=custom", "model.factory=mymodels_31:tiny", f"output_dir={tmp_path / 'runs'}", "rounds=2"]


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rayfl: error: "), err
    return lines[0]


def test_sequence_loss_all_is_refused_by_validate_and_run_with_the_fix(
    custom: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", *custom]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "train.sequence_loss" in line and "set train.sequence_loss=last" in line
    assert main(["run", *custom]) == 2
    assert "set train.sequence_loss=last" in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()
    assert main(["validate", *custom, "train.sequence_loss=last"]) == 0  # the fix the line names
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize("method", ["heterofl", "fedrolex", "model_search"])
def test_a_sub_model_method_is_refused_by_validate_and_run(
    method: str, custom: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*custom, "train.sequence_loss=last", f"algorithm.name={method}"]
    for command in ("validate", "run"):
        assert main([command, *args]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert "algorithm.name" in line and "fixed model" in line and "fedavg" in line, line
    assert not (tmp_path / "runs").exists()


def test_fedavg_on_its_smallest_sub_model_needs_a_family_too(
    custom: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", *custom, "train.sequence_loss=last", "algorithm.model=smallest"]) == 2
    assert "fixed model" in _one_error_line(capsys.readouterr().err)
