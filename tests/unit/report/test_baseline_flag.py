"""A result at or below the most-frequent-label baseline is flagged where results are compared: ``rayfl report``'s
table and the sweep's table and best-trial line (each trial shows its baseline)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from rayfl.report import load_run
from rayfl.report.tables import BASELINE_FLAG, markdown_table
from rayfl.tune.results import at_or_below_baseline
from rayfl.tune.results import markdown_table as sweep_table
from rayfl.tune.sweep import _best_line
from tests.unit.report.test_report import table_header, table_rows, write_run


def test_report_flags_a_final_accuracy_at_or_below_the_baseline(tmp_path: Path) -> None:
    learned = write_run(tmp_path / "a", name="learned", test_acc=[0.3, 0.5], baseline_acc=0.21)
    chance = write_run(tmp_path / "b", name="chance", test_acc=[0.3, 0.21], baseline_acc=0.21)
    below = write_run(tmp_path / "c", name="below", test_acc=[0.1, 0.034], baseline_acc=0.21)
    text = markdown_table([load_run(d) for d in (learned, chance, below)])
    final = table_header(text).index("Final acc")
    assert [row[final] for row in table_rows(text)] == ["50.00%", f"21.00%{BASELINE_FLAG}", f"3.40%{BASELINE_FLAG}"]


def test_sweep_table_shows_each_trials_baseline_and_flags_the_best_at_it(tmp_path: Path) -> None:
    table = pd.DataFrame(
        [
            {"trial": "t0", "lr": 0.1, "status": "completed", "test_acc": 0.2101, "baseline_acc": 0.2101},
            {"trial": "t1", "lr": 1.0, "status": "completed", "test_acc": 0.034, "baseline_acc": 0.2101},
            {"trial": "t2", "lr": 9.0, "status": "error", "test_acc": math.nan, "baseline_acc": 0.2101},
        ]
    )
    text = sweep_table(table, ["lr"])
    assert "| Baseline |" in text.splitlines()[0]
    rows = text.splitlines()[2:]
    assert rows[0].count(BASELINE_FLAG) == 1 and rows[1].count(BASELINE_FLAG) == 1 and BASELINE_FLAG not in rows[2]
    assert [at_or_below_baseline(dict(r)) for _, r in table.iterrows()] == [True, True, False]
    best = dict(table.iloc[0]) | {"run_dir": str(tmp_path / "t0")}
    line = _best_line(best, ["lr"], "test_acc", tmp_path)
    assert "AT OR BELOW its most-frequent-label baseline 0.2101" in line
    above = best | {"test_acc": 0.5}
    assert "above its most-frequent-label baseline" in _best_line(above, ["lr"], "test_acc", tmp_path)
