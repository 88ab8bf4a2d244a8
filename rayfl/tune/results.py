"""The sweep's results table: one row per trial, built from the trials' run directories.

Each row holds the trial's swept values, its status (``completed``; ``stopped`` when the scheduler ended it early;
``interrupted`` when the sweep was, before the trial ended: ``rayfl sweep --resume`` continues it; ``error``), and
figures read back from its run directory with ``rayfl.report.load_run`` (the same reader as ``rayfl report``): final
and best test accuracy, the most-frequent-label baseline (a final accuracy at or below it is flagged), final test
loss, simulated hours, memory and bandwidth utilisation (means over rounds), failed clients, distinct structures, hit
rate and search time (model search), rounds done, wall time, the average client accuracy, training GMACs, network MB
and global models (paper 002), and the run directory. Reading the run directories rather than Tune's last report keeps
a stopped or failed trial's rows as complete as its records. Where a trial's run directory cannot be read here (it was
written on another node's own disk, or not at all) the row is built from the trial's last report to Tune instead
(``TrialOutcome.reported``: the running figures ``metrics.RoundMetrics`` reports), and its ``figures_from`` column
says so (``run_dir``, ``tune_report`` or ``none``), as does a note under the
Markdown table: no row is silently empty.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from rayfl.tune.metrics import TABLE_METRICS
from rayfl.tune.space import plain

__all__ = [
    "BASELINE_FLAG",
    "COLUMN_HEADERS",
    "PERCENT_COLUMNS",
    "TrialOutcome",
    "at_or_below_baseline",
    "best_trial",
    "markdown_table",
    "results_table",
    "trial_row",
    "write_table",
]

Status = Literal["completed", "stopped", "interrupted", "error"]


@dataclass(frozen=True)
class TrialOutcome:
    """What Tune says about a finished trial."""

    name: str
    point: dict[str, Any]
    run_dir: Path
    errored: bool = False
    error: str = ""
    reported: Mapping[str, Any] = field(default_factory=dict)  # Tune's last result for the trial ({} if none)
    planned_rounds: int | None = None  # the rounds the trial's config asks for (when known without its run dir)
    # Tune's last result for the trial is not marked done (the sweep was interrupted before the trial ended or started;
    # or, restored from an earlier session, Tune saved its state before the trial's end: its records tell which)
    interrupted: bool = False


def _mean(series: pd.Series | None) -> float:
    if series is None:
        return math.nan
    finite = series[series.map(math.isfinite)]
    return float(finite.mean()) if len(finite) else math.nan


def _last(series: pd.Series | None) -> float:
    if series is None:
        return math.nan
    finite = series[series.map(math.isfinite)]
    return float(finite.iloc[-1]) if len(finite) else math.nan


def _figures(run_dir: Path) -> tuple[dict[str, float], int | None]:
    """The table's figures for one run directory, and the rounds its config asked for (None: no readable run)."""
    from rayfl.report import load_run

    empty = dict.fromkeys(TABLE_METRICS, math.nan)
    try:
        run = load_run(run_dir)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return empty, None
    failed, sampled = run.column("clients_failed"), run.column("clients_sampled")
    structures = _last(run.column("distinct_structures"))
    if not math.isfinite(structures):
        counted = run.distinct_structures
        structures = math.nan if counted is None else float(counted)
    failed_sum = float(failed.fillna(0).sum()) if failed is not None else math.nan
    sampled_sum = float(sampled.fillna(0).sum()) if sampled is not None else math.nan
    figures = {
        "test_acc": _none_nan(run.final_test_acc),
        "best_test_acc": _none_nan(run.best_test_acc),
        "baseline_acc": _none_nan(run.baseline_acc),
        "test_loss": _none_nan(run.final_test_loss),
        "sim_hours": run.sim_time_s / 3600.0,
        "memory_util": _mean(run.column("memory_util")),
        "bandwidth_util": _mean(run.column("bandwidth_util")),
        "clients_failed": failed_sum,
        "failure_rate": failed_sum / sampled_sum if sampled_sum > 0 else math.nan,
        "distinct_structures": structures,
        "hit_rate": _mean(run.column("hit_rate")),
        "search_s": _mean(run.column("search_s")),
        "rounds_done": float(run.rounds_run),
        "wall_s": _none_nan(run.wall_time_s),
        "client_acc": _none_nan(run.final_client_acc),
        "train_gmacs": math.nan if run.total_train_macs is None else run.total_train_macs / 1e9,
        "network_mb": math.nan if run.total_bytes is None else run.total_bytes / 1e6,
        "models": _none_nan(None if run.num_models is None else float(run.num_models)),
    }
    planned = run.config.get("rounds")
    return figures, int(planned) if isinstance(planned, int) else None


def _none_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _reported_figures(reported: Mapping[str, Any]) -> dict[str, float]:
    """The table's figures from a trial's last report to Tune (``metrics.RoundMetrics``); what a report cannot give
    (the baseline, wall time) stays NaN."""

    def get(key: str, scale: float = 1.0) -> float:
        value = reported.get(key)
        return float(value) / scale if isinstance(value, int | float) and not isinstance(value, bool) else math.nan

    failed, sampled = get("total_clients_failed"), get("total_clients_sampled")
    figures = dict.fromkeys(TABLE_METRICS, math.nan)
    figures.update(
        test_acc=get("test_acc"),
        best_test_acc=get("best_test_acc"),
        test_loss=get("test_loss"),
        sim_hours=get("sim_time_s", 3600.0),
        memory_util=get("mean_memory_util"),
        bandwidth_util=get("mean_bandwidth_util"),
        clients_failed=failed,
        failure_rate=failed / sampled if sampled > 0 else math.nan,
        distinct_structures=get("distinct_structures"),
        hit_rate=get("mean_hit_rate"),
        rounds_done=get("rounds_done"),
        client_acc=get("client_acc"),
        train_gmacs=get("train_gmacs"),
        network_mb=get("total_network_mb"),
        models=get("num_models"),
    )
    return figures


def trial_row(outcome: TrialOutcome) -> dict[str, Any]:
    """One row of the table (swept values under their dotted keys)."""
    figures, planned = _figures(outcome.run_dir)
    source = "run_dir"
    if planned is None:
        planned = outcome.planned_rounds
        if "rounds_done" in outcome.reported:
            figures, source = _reported_figures(outcome.reported), "tune_report"
        else:
            source = "none"
    status: Status = "completed"
    if outcome.errored:
        status = "error"
    elif outcome.interrupted and (planned is None or figures["rounds_done"] < planned):
        status = "interrupted"
    elif planned is None or figures["rounds_done"] < planned:
        status = "stopped"
    return {
        "trial": outcome.name,
        **{k: plain(v) for k, v in outcome.point.items()},
        "status": status,
        **figures,
        "error": outcome.error,
        "figures_from": source,
        "run_dir": str(outcome.run_dir),
    }


def results_table(outcomes: Sequence[TrialOutcome]) -> pd.DataFrame:
    """The table, trials in name order (Tune's trial index comes first in the name)."""
    rows = [trial_row(o) for o in sorted(outcomes, key=lambda o: o.name)]
    return pd.DataFrame(rows)


def write_table(table: pd.DataFrame, out_dir: Path) -> tuple[Path, Path]:
    """``results.csv`` and ``results.parquet`` in ``out_dir``; swept values of mixed types are stored as JSON text."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv, parquet = out_dir / "results.csv", out_dir / "results.parquet"
    table.to_csv(csv, index=False)
    _arrow_safe(table).to_parquet(parquet, index=False)
    return csv, parquet


def _arrow_safe(table: pd.DataFrame) -> pd.DataFrame:
    out = table.copy()
    for column in out.columns:
        if out[column].dtype != object:
            continue
        kinds = {type(v) for v in out[column] if v is not None}
        if len(kinds - {int, float}) > 0 and kinds != {str}:
            out[column] = [json.dumps(v) for v in out[column]]
    return out


def best_trial(table: pd.DataFrame, metric: str, mode: Literal["max", "min"]) -> Mapping[str, Any] | None:
    """The row with the best finite ``metric`` (``None`` when no trial has one)."""
    if metric not in table.columns or table.empty:
        return None
    values = pd.to_numeric(table[metric], errors="coerce")
    finite = values[values.map(math.isfinite)]
    if finite.empty:
        return None
    index = finite.idxmax() if mode == "max" else finite.idxmin()
    return dict(table.loc[index])


PERCENT_COLUMNS = {
    "test_acc",
    "best_test_acc",
    "baseline_acc",
    "memory_util",
    "bandwidth_util",
    "failure_rate",
    "hit_rate",
    "client_acc",
}
COLUMN_HEADERS = {
    "test_acc": "Final acc",
    "best_test_acc": "Best acc",
    "baseline_acc": "Baseline",
    "test_loss": "Final loss",
    "sim_hours": "Sim hours",
    "memory_util": "Mem util",
    "bandwidth_util": "BW util",
    "clients_failed": "Failed",
    "failure_rate": "Fail rate",
    "distinct_structures": "Structures",
    "hit_rate": "Hit rate",
    "search_s": "Search ms/round",
    "rounds_done": "Rounds",
    "wall_s": "Wall s",
    "client_acc": "Client acc",
    "train_gmacs": "Train GMACs",
    "network_mb": "Network MB",
    "models": "Models",
}


def _cell(column: str, value: Any) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        if column in PERCENT_COLUMNS:
            return f"{100.0 * value:.1f}%"
        if column == "search_s":
            return f"{1000.0 * value:.2f}"
        if column in ("clients_failed", "distinct_structures", "rounds_done", "models"):
            return f"{value:.0f}"
        if column in ("train_gmacs", "network_mb"):
            return f"{value:.1f}"
        return f"{value:.3g}" if column not in ("sim_hours", "test_loss", "wall_s") else f"{value:.3f}"
    return str(value)


def markdown_table(table: pd.DataFrame, param_keys: Sequence[str]) -> str:
    """A short Markdown table: trial, swept values, status and the figures some trial has (empty columns dropped)."""
    figures = [c for c in TABLE_METRICS if c in table.columns and table[c].map(_finite).any()]
    columns = ["trial", *param_keys, "status", *figures]
    head = ["Trial", *param_keys, "Status", *(COLUMN_HEADERS[c] for c in figures)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for _, row in table.iterrows():
        cells = [
            _cell(c, row[c]) + (BASELINE_FLAG if c == "test_acc" and at_or_below_baseline(row) else "") for c in columns
        ]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if "figures_from" in table.columns:
        for source, note in (
            ("tune_report", "run directory not readable here; figures from the trial's last report to Tune"),
            ("none", "no run directory readable here and no report to Tune: no figures"),
        ):
            names = [str(t) for t, s in zip(table["trial"], table["figures_from"], strict=True) if s == source]
            if names:
                text += f"\nTrials {', '.join(names)}: {note}.\n"
    return text


BASELINE_FLAG = " (<= baseline)"


def at_or_below_baseline(row: Mapping[str, Any], metric: str = "test_acc") -> bool:
    """Whether a trial's accuracy ``metric`` is known and at most its most-frequent-label baseline: such a trial
    learned nothing a constant guess does not (the sweep's summary and table flag it)."""
    value, baseline = row.get(metric), row.get("baseline_acc")
    if not (_finite(value) and _finite(baseline)):
        return False
    return float(value) <= float(baseline) + 1e-12  # type: ignore[arg-type]


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
