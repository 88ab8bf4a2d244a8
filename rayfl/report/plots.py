"""Accuracy curves as PNG files.

Figures are built on ``matplotlib.figure.Figure`` with an explicit Agg canvas, so no pyplot state and no
global backend setting is touched: safe to call from a CLI, a test or a headless worker.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rayfl.core.units import time_unit
from rayfl.report.atomic import replace_file
from rayfl.report.runs import RunRecords, unique_labels

__all__ = ["XAxis", "plot_accuracy", "plot_client_accuracy"]

log = logging.getLogger(__name__)

XAxis = Literal["round_idx", "sim_hours"]

_X_LABELS: dict[str, str] = {"round_idx": "Round (from 0, as in rounds.csv)", "sim_hours": "Simulated time ({unit})"}
_TITLES: dict[str, str] = {
    "round_idx": "Test accuracy vs. rounds",
    "sim_hours": "Test accuracy vs. simulated time",
}


def _x_values(evaluated: pd.DataFrame, x: XAxis, unit_s: float = 3600.0) -> list[float] | None:
    """The x coordinates of a run's evaluated rounds (simulated time in units of ``unit_s`` seconds), or None if the
    run lacks the needed column."""
    if x == "round_idx":
        if "round_idx" in evaluated.columns:
            return [float(v) for v in evaluated["round_idx"]]
        return [float(v) for v in evaluated.index]
    if "sim_time_s" not in evaluated.columns:
        return None
    return [float(v) / unit_s for v in evaluated["sim_time_s"]]


def plot_accuracy(
    runs: Sequence[RunRecords],
    out_png: str | Path,
    x: XAxis = "round_idx",
    labels: Sequence[str] | None = None,
    title_prefix: str = "",
    shared_baseline: bool = False,
) -> Path:
    """Draw test accuracy (in percent) against rounds or simulated hours, one line per run, and save a PNG.

    Only evaluated rounds (non-NaN ``test_acc``) are drawn. A run with a known most-frequent-class baseline
    also gets a dashed horizontal line in its own colour. Runs with nothing to draw (no evaluated rounds, or
    no simulated time on the ``sim_hours`` axis) are skipped with a warning; the figure (with its axes, labels
    and title) is written regardless.

    Args:
        runs: the loaded runs; legend labels are their names, disambiguated like the table's.
        out_png: where to write the PNG (parent directories are created).
        x: ``"round_idx"`` for the 0-based round index, ``"sim_hours"`` for simulated time (in s, min or h, the
            unit that suits the longest run).
        labels: legend labels, one per run, instead of the run names.
        title_prefix: text put before the title (e.g. the setting the runs belong to).
        shared_baseline: runs on the same data share one baseline: draw it once, in grey (the first known one),
            instead of one line per run (always so when every run's known baseline is the same).

    Returns:
        The path written.

    Raises:
        ValueError: ``x`` is neither ``"round_idx"`` nor ``"sim_hours"``, or ``labels`` does not have one label per
            run.
    """
    if x not in _X_LABELS:
        raise ValueError(f"x must be 'round_idx' or 'sim_hours', got {x!r}")
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"labels has {len(labels)} entries for {len(runs)} runs")
    out_path = Path(out_png)

    figure = Figure(figsize=(8.0, 5.0), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)

    drawn = 0
    shared: float | None = None
    # simulated time in the unit of the longest run (s, min or h: rayfl/core/units.py), so that short runs do not read 0
    unit, unit_s = time_unit(max([run.sim_time_s for run in runs if run.sim_time_s > 0], default=3600.0))
    known = {round(b, 9) for b in (run.baseline_acc for run in runs) if b is not None}
    shared_baseline = shared_baseline or (len(runs) > 1 and len(known) == 1)  # one data set: one baseline line
    for label, run in zip(unique_labels(runs) if labels is None else labels, runs, strict=True):
        if x == "sim_hours" and run.sim_time_s <= 0:
            log.warning("run %s has no simulated time; left out of the sim_hours plot", run.path)
            continue
        evaluated = run.evaluated()
        xs = _x_values(evaluated, x, unit_s)
        if xs is None:
            log.warning("run %s has no sim_time_s column; left out of the %s plot", run.path, x)
            continue
        ys = [100.0 * float(v) for v in evaluated["test_acc"]] if xs else []
        points = [(xv, yv) for xv, yv in zip(xs, ys, strict=True) if math.isfinite(xv)]
        if not points:
            log.warning("run %s has no evaluated rounds; left out of the %s plot", run.path, x)
            continue
        (line,) = axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
        drawn += 1
        baseline = run.baseline_acc
        if shared_baseline:
            shared = baseline if shared is None else shared
        elif baseline is not None:
            axes.axhline(
                100.0 * baseline,
                linestyle="--",
                linewidth=1.0,
                color=line.get_color(),
                label=f"{label} baseline",
            )

    if shared is not None:
        axes.axhline(100.0 * shared, linestyle="--", linewidth=1.0, color="grey", label="most-frequent-label baseline")
    axes.set_xlabel(_X_LABELS[x].format(unit=unit))
    if x == "round_idx":
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("Test accuracy (%)")
    axes.set_title(title_prefix + _TITLES[x])
    axes.grid(True, alpha=0.3)
    if drawn:
        axes.legend(loc="best", fontsize="small")
    else:
        axes.text(0.5, 0.5, "no evaluated rounds", ha="center", va="center", transform=axes.transAxes)

    figure.tight_layout()
    replace_file(out_path, lambda tmp: figure.savefig(tmp, format="png"))
    log.info("wrote %s", out_path)
    return out_path


def plot_client_accuracy(runs: Sequence[RunRecords], out_png: str | Path, labels: Sequence[str] | None = None) -> Path:
    """Box plot of the clients' accuracies (percent) at each run's last evaluated round, one box per run (paper
    002's Figure 6), with each run's mean (the average client accuracy) as a marker. Runs without per-client
    accuracies (``client_accs.csv``) are left out with a warning; the figure is written regardless."""
    out_path = Path(out_png)
    figure = Figure(figsize=(max(6.0, 1.6 * len(runs) + 2.0), 4.5), dpi=100)  # 6 in: the title fits one run too
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    data: list[list[float]] = []
    names: list[str] = []
    for label, run in zip(unique_labels(runs) if labels is None else labels, runs, strict=True):
        rows = run.client_accs()
        if rows is None:
            log.warning("run %s has no per-client accuracies; left out of the box plot", run.path)
            continue
        data.append([100.0 * float(v) for v in rows["test_acc"]])
        names.append(label)
    if data:
        axes.boxplot(data, showmeans=True)
        axes.set_xticks(range(1, len(names) + 1), names, rotation=15, ha="right", fontsize="small")
    else:
        axes.text(0.5, 0.5, "no per-client accuracies", ha="center", va="center", transform=axes.transAxes)
    axes.set_ylabel("Client test accuracy (%)")
    axes.set_title("Accuracy of each client on the model it uses")
    axes.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    replace_file(out_path, lambda tmp: figure.savefig(tmp, format="png"))
    log.info("wrote %s", out_path)
    return out_path
