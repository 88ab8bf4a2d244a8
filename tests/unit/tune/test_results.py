"""The sweep's results table, read back from the trials' run directories."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from rayfl.engine.search_only import run_search_only
from rayfl.tune.plots import plot_sweep
from rayfl.tune.results import TrialOutcome, best_trial, markdown_table, results_table, write_table
from tests.helpers import tiny_image_dataset
from tests.unit.engine.test_search_only import search_config


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[TrialOutcome]:
    data = tiny_image_dataset()
    out = tmp_path_factory.mktemp("trials")
    outcomes = []
    for index, epsilon in enumerate((0.2, 1.0)):
        cfg = dataclasses.replace(search_config(data, epsilon=epsilon), output_dir=str(out), name=f"{index:05d}")
        result = run_search_only(cfg, dataset=data)
        assert result.run_dir is not None
        outcomes.append(
            TrialOutcome(
                result.run_dir.name, {"algorithm.epsilon": epsilon, "algorithm.ratios": [0, 1]}, result.run_dir
            )
        )
    return outcomes


def test_one_row_per_trial_with_its_values_status_and_figures(runs: list[TrialOutcome]) -> None:
    table = results_table(runs)
    assert list(table["trial"]) == ["00000", "00001"] and list(table["algorithm.epsilon"]) == [0.2, 1.0]
    assert list(table["status"]) == ["completed", "completed"]
    assert table["memory_util"].between(0, 1).all() and table["bandwidth_util"].between(0, 1).all()
    assert table["hit_rate"].iloc[1] == 0.0 and table["distinct_structures"].iloc[1] <= 2
    assert (table["rounds_done"] == 6).all() and (table["sim_hours"] > 0).all()
    assert table["test_acc"].isna().all()  # search-only trials train nothing
    rounds = pd.read_csv(Path(runs[0].run_dir) / "rounds.csv")
    assert table["memory_util"].iloc[0] == pytest.approx(rounds["memory_util"].mean())


def test_stopped_errored_and_missing_trials_are_rows_too(runs: list[TrialOutcome], tmp_path: Path) -> None:
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    for name in ("config.yaml", "rounds.csv"):
        (stopped / name).write_text((runs[0].run_dir / name).read_text())
    rows = pd.read_csv(stopped / "rounds.csv").iloc[:2]
    rows.to_csv(stopped / "rounds.csv", index=False)  # as if a scheduler had ended it after two rounds
    table = results_table(
        [
            TrialOutcome("a", {"algorithm.epsilon": 0.4}, stopped),
            TrialOutcome("b", {"algorithm.epsilon": 0.6}, tmp_path / "never-written", errored=True, error="boom"),
            TrialOutcome("c", {"algorithm.epsilon": 0.8}, stopped, interrupted=True),  # the sweep's interrupt
            # Tune's saved last result lacks "done" (saved before the trial's end), but its records are whole
            TrialOutcome("d", {"algorithm.epsilon": 0.9}, runs[0].run_dir, interrupted=True),
        ]
    )
    assert list(table["status"]) == ["stopped", "error", "interrupted", "completed"]
    assert table["rounds_done"].iloc[0] == 2
    assert math.isnan(table["memory_util"].iloc[1]) and table["error"].iloc[1] == "boom"


def test_tables_files_best_trial_and_plot(runs: list[TrialOutcome], tmp_path: Path) -> None:
    table = results_table(runs)
    csv, parquet = write_table(table, tmp_path)
    assert len(pd.read_csv(csv)) == len(pd.read_parquet(parquet)) == 2
    best = best_trial(table, "memory_util", "max")
    assert best is not None and best["memory_util"] == table["memory_util"].max()
    assert best_trial(table, "test_acc", "max") is None
    text = markdown_table(table, ["algorithm.epsilon"])
    assert text.count("\n") == 4 and "Mem util" in text and "Final acc" not in text  # empty columns are left out
    png = plot_sweep(table, tmp_path / "plot.png", "algorithm.epsilon", "", ["memory_util", "hit_rate"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_directory_not_readable_here_falls_back_to_the_last_report(tmp_path: Path) -> None:
    reported = {
        "rounds_done": 4,
        "sim_time_s": 7200.0,
        "test_acc": 0.55,
        "best_test_acc": 0.6,
        "test_loss": 1.2,
        "mean_memory_util": 0.4,
        "total_clients_failed": 2,
        "total_clients_sampled": 8,
        "evaluated": True,
    }
    elsewhere = tmp_path / "on-another-node"  # written on a worker's own disk: absent here
    table = results_table(
        [
            TrialOutcome("a", {"seed": 0}, elsewhere, reported=reported, planned_rounds=4),
            TrialOutcome("b", {"seed": 1}, elsewhere, reported=dict(reported, rounds_done=2), planned_rounds=4),
            TrialOutcome("c", {"seed": 2}, elsewhere, errored=True, error="boom"),
        ]
    )
    assert list(table["figures_from"]) == ["tune_report", "tune_report", "none"]
    assert list(table["status"]) == ["completed", "stopped", "error"]
    assert (table["test_acc"].iloc[0], table["best_test_acc"].iloc[0], table["sim_hours"].iloc[0]) == (0.55, 0.6, 2.0)
    assert (table["memory_util"].iloc[0], table["failure_rate"].iloc[0]) == (0.4, 0.25)
    best = best_trial(table, "test_acc", "max")
    assert best is not None and best["trial"] == "a"  # not "Best trial: none"
    text = markdown_table(table, ["seed"])
    assert "Trials a, b: run directory not readable here; figures from the trial's last report to Tune." in text
    assert "Trials c: no run directory readable here and no report to Tune: no figures." in text
