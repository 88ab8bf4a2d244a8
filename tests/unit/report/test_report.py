"""Tests for ``rayfl.report``: run loading, the Markdown table, the accuracy plots and the one-call report.

Every test writes real run directories (parquet, CSV, YAML, JSON) under ``tmp_path``; nothing is mocked.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from rayfl.report import (
    ACCURACY_VS_ROUNDS_PNG,
    ACCURACY_VS_SIM_HOURS_PNG,
    REPORT_MD,
    load_run,
    markdown_table,
    plot_accuracy,
    report,
    unique_labels,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NAN = math.nan


def write_run(
    run_dir: Path,
    *,
    name: str,
    algorithm: str = "fedavg",
    model: str = "cnn",
    data: str = "cifar10",
    test_acc: list[float],
    test_loss: list[float] | None = None,
    sim_step_s: float = 0.0,
    baseline_acc: float | None = 0.1,
    with_summary: bool = True,
    extra_columns: dict[str, list[Any]] | None = None,
) -> Path:
    """Write a run directory the way the engine does: rounds.parquet/csv, config.yaml, summary.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    n = len(test_acc)
    losses = test_loss if test_loss is not None else [NAN if math.isnan(a) else 2.0 - a for a in test_acc]
    frame = pd.DataFrame(
        {
            "round_idx": list(range(n)),
            "sim_time_s": [sim_step_s * (i + 1) for i in range(n)],
            "train_loss": [1.5 - 0.1 * i for i in range(n)],
            "test_acc": test_acc,
            "test_loss": losses,
            "clients_run": [10] * n,
            "clients_failed": [0] * n,
            "bytes_down": [1_000_000] * n,
            "bytes_up": [500_000] * n,
            "wall_time_s": [2.0 * (i + 1) for i in range(n)],
            "round_wall_s": [2.0] * n,
            **(extra_columns or {}),
        }
    )
    frame.to_parquet(run_dir / "rounds.parquet", index=False)
    frame.to_csv(run_dir / "rounds.csv", index=False)
    config = {
        "name": name,
        "seed": 0,
        "rounds": n,
        "algorithm": {"name": algorithm},
        "model": {"name": model},
        "data": {"name": data},
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    if with_summary:
        finite = [a for a in test_acc if not math.isnan(a)]
        summary = {
            "name": name,
            "algorithm": algorithm,
            "final_test_acc": finite[-1] if finite else NAN,
            "baseline_acc": baseline_acc,
            "rounds": n,
            "wall_time_s": 2.0 * n,
            "sim_time_s": sim_step_s * n,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return run_dir


@pytest.fixture
def two_runs(tmp_path: Path) -> list[Path]:
    """Two finished runs without a simulated clock; evaluation every other round."""
    first = write_run(
        tmp_path / "run_a",
        name="fedavg-cifar",
        test_acc=[0.30, NAN, 0.5512, NAN, 0.5034],
        extra_columns={"mem_util": [0.5] * 5, "distinct_structures": [1] * 5},
    )
    second = write_run(
        tmp_path / "run_b",
        name="fedprox-cifar",
        algorithm="fedprox",
        model="resnet",
        test_acc=[0.20, 0.40, 0.6125],
        baseline_acc=None,
    )
    return [first, second]


def table_rows(markdown: str) -> list[list[str]]:
    """The body rows of the first Markdown table in ``markdown``, as lists of stripped cells."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def table_header(markdown: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith("|"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def assert_png(path: Path) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5_000, f"{path} is suspiciously small ({len(data)} bytes)"


# ------------------------------------------------------------------------------------------------ load_run
def test_load_run_reads_all_files(two_runs: list[Path]) -> None:
    run = load_run(two_runs[0])
    assert run.path == two_runs[0]
    assert run.name == "fedavg-cifar"
    assert run.algorithm == "fedavg"
    assert run.config["model"] == {"name": "cnn"}
    assert run.has_summary_file
    assert run.summary["baseline_acc"] == pytest.approx(0.1)
    assert list(run.rounds["round_idx"]) == [0, 1, 2, 3, 4]
    assert "mem_util" in run.rounds.columns  # unknown columns are kept, not rejected
    assert run.final_test_acc == pytest.approx(0.5034)
    assert run.best_test_acc == pytest.approx(0.5512)
    assert run.total_bytes == 5 * 1_500_000
    assert run.sim_time_s == 0.0


@pytest.mark.parametrize("missing", ["config.yaml", "rounds"])
def test_not_a_run_dir_names_the_missing_file(tmp_path: Path, missing: str) -> None:
    run_dir = write_run(tmp_path / "broken", name="x", test_acc=[0.5])
    if missing == "rounds":
        (run_dir / "rounds.parquet").unlink()
        (run_dir / "rounds.csv").unlink()
        expected = "rounds.parquet"
    else:
        (run_dir / missing).unlink()
        expected = missing
    with pytest.raises(FileNotFoundError) as info:
        load_run(run_dir)
    assert expected in str(info.value)
    assert str(run_dir) in str(info.value)


def test_empty_and_absent_directories_are_rejected(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"config\.yaml"):
        load_run(empty)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nowhere")


def test_csv_is_used_when_parquet_is_missing(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "csv_only", name="csv", test_acc=[0.25, 0.75])
    (run_dir / "rounds.parquet").unlink()
    run = load_run(run_dir)
    assert len(run.rounds) == 2
    assert run.final_test_acc == pytest.approx(0.75)


def test_missing_optional_columns_are_tolerated(tmp_path: Path) -> None:
    run_dir = tmp_path / "sparse"
    run_dir.mkdir()
    pd.DataFrame({"round_idx": [0, 1], "test_acc": [NAN, 0.42]}).to_parquet(run_dir / "rounds.parquet")
    (run_dir / "config.yaml").write_text("name: sparse\n", encoding="utf-8")
    run = load_run(run_dir)
    assert run.algorithm == "unknown"
    assert run.total_bytes is None
    assert run.final_test_loss is None
    row = table_rows(markdown_table([run]))[0]
    assert row[0] == "sparse"
    assert row[5] == "42.00%"
    assert row[-1] == "—"


# ------------------------------------------------------------------------------------------------ tables
def test_markdown_table_has_header_and_one_row_per_run(two_runs: list[Path]) -> None:
    runs = [load_run(path) for path in two_runs]
    text = markdown_table(runs)
    header = table_header(text)
    assert header[0] == "Run"
    assert "Final acc" in header and "Best acc" in header and "Baseline acc" in header
    rows = table_rows(text)
    assert len(rows) == 2
    by_col = [dict(zip(header, row, strict=True)) for row in rows]

    assert by_col[0]["Run"] == "fedavg-cifar"
    assert by_col[0]["Algorithm"] == "fedavg"
    assert by_col[0]["Model"] == "cnn"
    assert by_col[0]["Data"] == "cifar10"
    assert by_col[0]["Rounds"] == "5"
    assert by_col[0]["Final acc"] == "50.34%"  # last evaluated round, not the best one
    assert by_col[0]["Best acc"] == "55.12%"
    assert by_col[0]["Baseline acc"] == "10.00%"
    assert by_col[0]["Final loss"] == "1.4966"
    assert by_col[0]["Sim time"] == "0.000 s"
    assert by_col[0]["Wall time (s)"] == "10.0"
    assert by_col[0]["MB moved"] == "7.50"

    assert by_col[1]["Run"] == "fedprox-cifar"
    assert by_col[1]["Model"] == "resnet"
    assert by_col[1]["Final acc"] == "61.25%"
    assert by_col[1]["Best acc"] == "61.25%"
    assert by_col[1]["Baseline acc"] == "—"


def test_duplicate_names_are_disambiguated(tmp_path: Path) -> None:
    dirs = [
        write_run(tmp_path / "seed0", name="same", test_acc=[0.5]),
        write_run(tmp_path / "seed1", name="same", test_acc=[0.6]),
        write_run(tmp_path / "other", name="unique", test_acc=[0.7]),
    ]
    runs = [load_run(path) for path in dirs]
    assert unique_labels(runs) == ["same (seed0)", "same (seed1)", "unique"]
    names = [row[0] for row in table_rows(markdown_table(runs))]
    assert names == ["same (seed0)", "same (seed1)", "unique"]


def test_same_name_and_same_directory_name_still_unique(tmp_path: Path) -> None:
    dirs = [
        write_run(tmp_path / "a" / "run", name="dup", test_acc=[0.5]),
        write_run(tmp_path / "b" / "run", name="dup", test_acc=[0.6]),
    ]
    labels = unique_labels([load_run(path) for path in dirs])
    assert len(set(labels)) == 2
    assert all(label.startswith("dup (run)") for label in labels)


def test_pipes_in_names_do_not_break_the_table(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "p", name="a|b", test_acc=[0.5]))
    line = markdown_table([run]).splitlines()[2]
    assert line.startswith("| a\\|b |")


def test_run_without_summary_still_reports(tmp_path: Path) -> None:
    run_dir = write_run(
        tmp_path / "interrupted",
        name="cut-short",
        algorithm="scaffold",
        test_acc=[0.1, NAN, 0.3, NAN],
        with_summary=False,
    )
    run = load_run(run_dir)
    assert not run.has_summary_file
    assert run.name == "cut-short"
    assert run.algorithm == "scaffold"
    assert run.summary["final_test_acc"] == pytest.approx(0.3)
    assert run.summary["rounds"] == 4
    assert run.summary["baseline_acc"] is None

    markdown, pngs = report([run_dir])
    row = table_rows(markdown)[0]
    assert row[:5] == ["cut-short", "scaffold", "cnn", "cifar10", "4"]
    assert row[5] == "30.00%"
    assert row[7] == "—"
    assert [p.name for p in pngs] == [ACCURACY_VS_ROUNDS_PNG]
    assert_png(pngs[0])


# ------------------------------------------------------------------------------------------------ plots
def test_plot_accuracy_writes_a_real_png(two_runs: list[Path], tmp_path: Path) -> None:
    runs = [load_run(path) for path in two_runs]
    out = plot_accuracy(runs, tmp_path / "plots" / "acc.png")
    assert out == tmp_path / "plots" / "acc.png"
    assert_png(out)


def test_plot_accuracy_rejects_unknown_axis(two_runs: list[Path], tmp_path: Path) -> None:
    runs = [load_run(path) for path in two_runs]
    with pytest.raises(ValueError, match="x must be"):
        plot_accuracy(runs, tmp_path / "bad.png", x="wall")  # type: ignore[arg-type]
    assert not (tmp_path / "bad.png").exists()


def test_sim_hours_plot_leaves_out_runs_without_sim_time(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    timed = load_run(write_run(tmp_path / "timed", name="timed", test_acc=[0.2, 0.4], sim_step_s=600.0))
    untimed = load_run(write_run(tmp_path / "untimed", name="untimed", test_acc=[0.3, 0.5]))
    with caplog.at_level("WARNING", logger="rayfl.report.plots"):
        out = plot_accuracy([timed, untimed], tmp_path / "sim.png", x="sim_hours")
    assert_png(out)
    skipped = [r.getMessage() for r in caplog.records if "no simulated time" in r.getMessage()]
    assert len(skipped) == 1
    assert "untimed" in skipped[0]


def test_plot_without_any_evaluation_still_writes(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "noeval", name="noeval", test_acc=[NAN, NAN]))
    assert_png(plot_accuracy([run], tmp_path / "noeval.png", x="round_idx"))


# ------------------------------------------------------------------------------------------------ report
def test_report_without_sim_time_writes_only_the_rounds_plot(two_runs: list[Path]) -> None:
    markdown, pngs = report(two_runs)
    out_dir = two_runs[0]
    assert pngs == [out_dir / ACCURACY_VS_ROUNDS_PNG]
    assert_png(pngs[0])
    assert not (out_dir / ACCURACY_VS_SIM_HOURS_PNG).exists()
    assert (out_dir / REPORT_MD).read_text(encoding="utf-8") == markdown
    assert len(table_rows(markdown)) == 2
    assert f"({ACCURACY_VS_ROUNDS_PNG})" in markdown


def test_report_with_sim_time_adds_the_sim_hours_plot(two_runs: list[Path], tmp_path: Path) -> None:
    timed = write_run(tmp_path / "timed", name="timed", test_acc=[0.2, 0.4, 0.6], sim_step_s=1800.0)
    out_dir = tmp_path / "out"
    markdown, pngs = report([*two_runs, timed], out_dir=out_dir)
    assert [p.name for p in pngs] == [ACCURACY_VS_ROUNDS_PNG, ACCURACY_VS_SIM_HOURS_PNG]
    assert all(p.parent == out_dir for p in pngs)
    for png in pngs:
        assert_png(png)
    assert (out_dir / REPORT_MD).is_file()
    rows = {row[0]: row for row in table_rows(markdown)}
    assert rows["timed"][9] == "1.500 h"  # 3 rounds x 1800 s
    assert not (two_runs[0] / REPORT_MD).exists()


def test_report_needs_a_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one"):
        report([], out_dir=tmp_path)
    assert not (tmp_path / REPORT_MD).exists()


def test_structures_and_over_budget_come_from_the_client_and_round_records(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "search", name="search", test_acc=[0.5, 0.6], extra_columns={"over_budget": [1, 2]})
    pd.DataFrame(
        {
            "round_idx": [0, 0, 0, 1, 1],
            "client_id": [1, 2, 3, 1, 2],
            "failure": ["", "", "memory", "", ""],
            "units": ["1 2", "2 2", "9 9", "1 2", ""],  # the failed client's structure does not count
        }
    ).to_csv(run_dir / "clients.csv", index=False)
    run = load_run(run_dir)
    assert run.distinct_structures == 3  # "1 2", "2 2" and the full model ""
    assert run.over_budget == 3
    header, *rows = markdown_table([run]).splitlines()
    cells = [c.strip() for c in rows[1].strip("|").split("|")]
    names = [c.strip() for c in header.strip("|").split("|")]
    assert cells[names.index("Structures")] == "3"
    assert cells[names.index("Over budget")] == "3"


def test_a_damaged_parquet_falls_back_to_a_whole_csv_and_is_named_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26: a truncated rounds.parquet is named in one warning and rounds.csv is read; where the CSV is cut short
    too, ``rayfl report`` ends in one line naming the Parquet file and the CSV."""
    from rayfl.cli import main

    run_dir = write_run(tmp_path / "run", name="cut", test_acc=[0.3, NAN, 0.5])
    whole = load_run(run_dir).rounds
    parquet = run_dir / "rounds.parquet"
    parquet.write_bytes(parquet.read_bytes()[: parquet.stat().st_size // 2])
    (run_dir / "summary.json").write_text('{"name": "cut", "final_te')  # cut by a full disk: derived instead
    caplog.set_level("WARNING")
    fallen_back = load_run(run_dir)
    pd.testing.assert_frame_equal(fallen_back.rounds, whole, check_dtype=False)
    assert fallen_back.summary["rounds"] == 3 and not fallen_back.has_summary_file
    assert f"{parquet} is damaged or not a rayfl record file" in caplog.text and "reading" in caplog.text
    assert main(["report", str(run_dir), "--out", str(tmp_path / "out")]) == 0
    csv = run_dir / "rounds.csv"
    csv.write_bytes(csv.read_bytes()[:-7])  # inside the last row
    assert main(["report", str(run_dir), "--out", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"rayfl: error: {parquet} is damaged") and f"{csv} is not whole either" in line
    csv.write_bytes(b"\x00\xff" * 64)  # binary bytes: not a CSV at all
    assert main(["report", str(run_dir), "--out", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{csv} is damaged or not a rayfl record file" in line
