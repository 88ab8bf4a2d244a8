"""The sweep file's reference (``docs/sweep-reference.md``) is generated from its dataclasses, as the experiment's
config reference is, and kept in sync."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rayfl.experiment.reference import entries
from rayfl.tune.reference import render_sweep_reference
from rayfl.tune.spec import SweepConfig

REFERENCE = Path(__file__).resolve().parents[3] / "docs" / "sweep-reference.md"


def test_the_sweep_reference_file_is_in_sync_with_the_dataclasses() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == render_sweep_reference(), (
        "docs/sweep-reference.md is stale: regenerate it with python -m rayfl.tune.reference > docs/sweep-reference.md"
    )


def test_every_sweep_field_is_listed_with_its_default_and_doc() -> None:
    sections = {prefix: (summary, {e.key: e for e in rows}) for prefix, _, summary, rows in entries(SweepConfig)}
    listed = {key: e for _, rows in sections.values() for key, e in rows.items()}
    for f in dataclasses.fields(SweepConfig):
        assert f.name in listed or f.name in sections, f.name
    assert listed["num_samples"].bounds == ">= 1" and listed["search"].type_text == "'grid' | 'random'"
    assert listed["plot.x"].default == "(required)"  # PlotConfig has no default x
    assert listed["trial_resources.driver_cpus"].default == "0.25"
    assert listed["scheduler.grace_period_s"].doc.startswith("simulated seconds")
    assert "`scheduler` is `null` by default" in sections["scheduler"][0]  # no ASHA unless the file asks for it
    assert all(e.doc for e in listed.values()), "a sweep field without a comment"
