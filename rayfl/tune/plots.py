"""A sweep's figure: each metric of the results table against one swept key, one line per value of another.

Paper 000's Figure 10 is this plot for the search-only sweep: memory utilisation, bandwidth utilisation and hit rate
against epsilon, one line per T_max. Built like ``rayfl/report/plots.py``: a ``Figure`` with an explicit Agg canvas, no
pyplot state.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rayfl.tune.metrics import TABLE_METRICS
from rayfl.tune.results import COLUMN_HEADERS, PERCENT_COLUMNS

__all__ = ["plot_sweep"]

log = logging.getLogger(__name__)


def _numeric(values: pd.Series) -> pd.Series:
    return pd.to_numeric(values, errors="coerce").astype(float)


def plot_sweep(table: pd.DataFrame, out_png: Path, x: str, lines: str, metrics: Sequence[str]) -> Path:
    """One panel per metric (percent for fractions): mean over trials sharing ``(x, lines)`` (repeated samples)
    against ``x``, one line per value of ``lines`` (a single line when ``lines`` is empty); when ``x`` is a metric of
    the table, every trial is a point (paper 002: average client accuracy against total training MACs), hollow when a
    scheduler stopped it early."""
    figure = Figure(figsize=(4.2 * len(metrics), 3.8), dpi=100)
    FigureCanvasAgg(figure)
    groups = [(None, table)] if not lines else list(table.groupby(lines, sort=True))
    for panel, metric in enumerate(metrics):
        axes = figure.add_subplot(1, len(metrics), panel + 1)
        scale = 100.0 if metric in PERCENT_COLUMNS else 1.0
        for index, (value, rows) in enumerate(groups):
            label = None if value is None else f"{lines.rsplit('.', 1)[-1]} = {value}"
            if x in TABLE_METRICS:  # a figure against a figure: every trial is a point, hollow if stopped early
                xs, ys = _numeric(rows[x]), _numeric(rows[metric]) * scale
                keep = xs.map(math.isfinite) & ys.map(math.isfinite)
                done = keep & (rows["status"] == "completed") if "status" in rows else keep
                colour = f"C{index % 10}"
                axes.scatter(xs[done], ys[done], s=22, color=colour, label=label)
                axes.scatter(xs[keep & ~done], ys[keep & ~done], s=22, facecolors="none", edgecolors=colour)
                continue
            means = rows.assign(_y=_numeric(rows[metric]) * scale).groupby(x, sort=True)["_y"].mean()
            points = [(float(k), float(v)) for k, v in means.items() if math.isfinite(v)]
            if not points:
                continue
            axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
        axes.set_xlabel(COLUMN_HEADERS.get(x, x.rsplit(".", 1)[-1]))
        axes.set_ylabel(COLUMN_HEADERS.get(metric, metric) + (" (%)" if scale == 100.0 else ""))
        axes.grid(True, alpha=0.3)
        if lines and axes.get_legend_handles_labels()[0]:
            axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, format="png")
    log.info("wrote %s", out_png)
    return out_png
