"""One round numbering and one way of writing simulated time everywhere a user reads them: the progress line,
``rounds.csv``, ``report.md``'s per-round table (rounds from 0; time in s, min or h with enough digits)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from rayfl.cli import main
from rayfl.core.units import format_sim_time
from tests.helpers import tiny_yaml

TINY = tiny_yaml("numbering", 3, 'system:\n  bandwidth_down: {{source: constant, low: 2.0}}\n')

_PROGRESS = re.compile(r"^round\s+(\d+)/(\d+) \|.*\| sim\s+(.+?) \|")


def test_progress_line_records_and_report_agree_on_rounds_and_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(TINY.format(out=tmp_path / "runs"))
    assert main(["run", str(path)]) == 0
    shown = [m.groups() for m in map(_PROGRESS.match, capsys.readouterr().out.splitlines()) if m]
    run_dir = tmp_path / "runs" / "numbering"
    rounds = pd.read_csv(run_dir / "rounds.csv")
    assert [int(r) for r, _, _ in shown] == list(rounds["round_idx"]) == [0, 1, 2]
    assert {int(last) for _, last, _ in shown} == {2}  # the last round's number, as the records number it
    times = [format_sim_time(float(t)) for t in rounds["sim_time_s"]]
    assert [t for _, _, t in shown] == times
    assert all(t.endswith((" s", " min", " h")) and float(t.split()[0]) > 0 for t in times)
    report = (run_dir / "report.md").read_text()
    table = report[report.index("per round") :].splitlines()
    header = [c.strip() for c in table[2].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[4:] if line.startswith("|")]
    at = header.index("Round"), header.index("Sim time")
    assert [(row[at[0]], row[at[1]]) for row in rows] == [(str(i), t) for i, t in enumerate(times)]
