"""The config reference (``docs/config-reference.md``) is generated from the config dataclasses and kept in sync;
``rayfl validate --explain`` tells, for every resolved value, the line, override or default it came from."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rayfl.cli import main
from rayfl.config.sections import SystemConfig
from rayfl.experiment.explain import explained_values
from rayfl.experiment.reference import entries, field_docs, render_reference
from rayfl.experiment.schema import ExperimentConfig

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"


def test_the_reference_file_is_in_sync_with_the_dataclasses() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == render_reference(), (
        "docs/config-reference.md is stale: regenerate it with python -m rayfl.experiment.reference > "
        "docs/config-reference.md"
    )


def test_every_top_level_key_and_section_default_is_listed() -> None:
    listed = {e.key: e for _, _, _, rows in entries() for e in rows}
    for f in dataclasses.fields(ExperimentConfig):
        assert f.name in listed or any(k.startswith((f"{f.name}.", f"{f.name}[")) for k in listed), f.name
    # a nested section's defaults are its enclosing section's (compute is a constant speed by default)
    assert listed["system.compute.source"].default == f"'{SystemConfig().compute.source}'"
    assert listed["system.comm_limit_s"].bounds == "> 0" and listed["rounds"].bounds == ">= 1"
    assert listed["system.comm_limit_s"].doc.startswith("the communication time limit")
    assert "algorithm.budgets" in listed and "'enforce' | 'ignore'" in listed["algorithm.budgets"].type_text


def test_field_docs_take_the_comment_beside_or_above_a_field() -> None:
    @dataclasses.dataclass
    class Example:
        # the comment above
        # over two lines
        above: int = 1
        beside: float = 2.0  # the comment beside
        bare: str = ""

    docs = field_docs(Example)
    assert docs == {"above": "the comment above over two lines", "beside": "the comment beside"}


def test_explain_gives_each_value_its_line_override_or_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("name: x\nrounds: 4\ndata:\n  name: synthetic\n  num_clients: 16\nmodel: {name: cnn}\n")
    rows = {key: (value, where) for key, value, where in explained_values(path, ["train.lr=0.25"])}
    assert rows["rounds"] == ("4", "exp.yaml:2")
    assert rows["data.num_clients"] == ("16", "exp.yaml:5")
    assert rows["model.name"] == ("cnn", "exp.yaml:6")  # a mapping written on one line
    assert rows["train.lr"] == ("0.25", "override 'train.lr=0.25'")
    assert rows["seed"] == ("0", "default") and rows["model.channels"][1] == "default"
    assert main(["validate", "--explain", str(path), "train.lr=0.25"]) == 0
    out = capsys.readouterr().out
    assert "train.lr = 0.25" in out and "# override 'train.lr=0.25'" in out and out.rstrip().endswith(")")
