"""Paper 000's comparison layouts, built from run directories grouped into settings and methods.

* **Table 3**: methods as rows, settings as columns, two blocks: final test accuracy and simulated latency (hours).
* **Figure 6**: mean memory and bandwidth utilisation (need / budget of the clients that trained) per method and
  setting, as a Markdown table and as grouped bars in a PNG.
* **Figure 12**: test accuracy against rounds and against simulated hours, one pair of plots per setting.

A run's *setting* is ``config.setting`` (``ExperimentConfig.setting``), or the name of the folder that holds the run
directory when the config has none (``runs/paper-cpu/setting3/<run>`` is in ``setting3``). Its *method* is read off
the resolved config: the algorithm, whether in-place distillation is on, and for FedAvg which model it trains and
whether it respects budgets (``method_label``). When a setting holds two runs of one method, the later one in the
order given wins, with a warning.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rayfl.report.atomic import replace_file
from rayfl.report.plots import plot_accuracy
from rayfl.report.runs import RunRecords

__all__ = [
    "METHOD_ORDER",
    "UTILISATION_PNG",
    "PaperGrid",
    "method_label",
    "paper_grid",
    "plot_setting_curves",
    "plot_utilisation",
    "setting_of",
    "table3_markdown",
    "utilisation_markdown",
]

log = logging.getLogger(__name__)

UTILISATION_PNG = "utilisation.png"

# Table 3's rows, in the paper's order; methods not listed follow in the order they are first met.
METHOD_ORDER: tuple[str, ...] = (
    "Largest",
    "FedAvg",
    "Smallest",
    "HeteroFL",
    "FjORD",
    "FedRolex",
    "FedDropout",
    "AnyCostFL",
    "Model search (w/o)",
    "Model search (w/)",
)

_DISPLAY = {
    "heterofl": "HeteroFL",
    "fjord": "FjORD",
    "fedrolex": "FedRolex",
    "feddropout": "FedDropout",
    "anycostfl": "AnyCostFL",
    "model_search": "Model search",
}

MISSING = "—"


def setting_of(run: RunRecords) -> str:
    """``config.setting`` when set, else the name of the folder holding the run directory."""
    label = run.config.get("setting")
    if isinstance(label, str) and label:
        return label
    return run.path.resolve().parent.name


def method_label(config: Mapping[str, Any]) -> str:
    """The method a resolved config runs, in Table 3's wording.

    FedAvg is "Largest" (the full model, budgets ignored), "FedAvg" (the full model, budgets enforced) or "Smallest";
    a method with in-place distillation gets "(w/)"; the core method without it "(w/o)"; QSGD upload compression
    adds "+ QSGD".
    """
    algo = config.get("algorithm")
    algo = algo if isinstance(algo, Mapping) else {}
    name = str(algo.get("name", "unknown"))
    if name == "fedavg":
        if algo.get("model") == "smallest":
            label = "Smallest"
        else:
            label = "Largest" if algo.get("budgets") == "ignore" else "FedAvg"
    else:
        distill = algo.get("distill")
        distilled = isinstance(distill, Mapping) and bool(distill.get("enabled"))
        label = _DISPLAY.get(name, name)
        if distilled:
            label += " (w/)"
        elif name == "model_search":
            label += " (w/o)"
    compression = config.get("compression")
    if isinstance(compression, Mapping) and compression.get("kind") not in (None, "none"):
        label += f" + {str(compression['kind']).upper()}"
    return label


def _natural_key(text: str) -> list[Any]:
    """``setting2`` before ``setting10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


@dataclass(frozen=True)
class PaperGrid:
    """Runs arranged by method (rows) and setting (columns)."""

    methods: tuple[str, ...]
    settings: tuple[str, ...]
    cells: Mapping[tuple[str, str], RunRecords]  # (method, setting) -> run

    def get(self, method: str, setting: str) -> RunRecords | None:
        return self.cells.get((method, setting))

    def runs_of(self, setting: str) -> list[tuple[str, RunRecords]]:
        """(method, run) of one setting, in row order."""
        return [(m, run) for m in self.methods if (run := self.get(m, setting)) is not None]


def paper_grid(runs: Sequence[RunRecords]) -> PaperGrid:
    """Group runs by method and setting (see the module docstring)."""
    cells: dict[tuple[str, str], RunRecords] = {}
    seen: list[str] = []
    for run in runs:
        key = (method_label(run.config), setting_of(run))
        if key in cells:
            log.warning("%s and %s are both %s in %s; the report uses %s", cells[key].path, run.path, *key, run.path)
        cells[key] = run
        if key[0] not in seen:
            seen.append(key[0])
    methods = [m for m in METHOD_ORDER if m in seen] + [m for m in seen if m not in METHOD_ORDER]
    settings = sorted({s for _, s in cells}, key=_natural_key)
    return PaperGrid(tuple(methods), tuple(settings), cells)


# ----------------------------------------------------------------------------------------------- tables
def _hours(seconds: float) -> str:
    """Simulated hours with two decimals, or three significant digits below one hour (CPU-sized runs)."""
    hours = seconds / 3600.0
    return f"{hours:.2f}" if hours >= 1.0 or hours == 0.0 else f"{hours:.3g}"


def _percent(value: float | None) -> str:
    return MISSING if value is None or not math.isfinite(value) else f"{100.0 * value:.2f}"


def _mean_column(run: RunRecords, column: str) -> float | None:
    values = run.column(column)
    if values is None:
        return None
    finite = values[values.map(math.isfinite)]
    return float(finite.mean()) if len(finite) else None


def _block(grid: PaperGrid, title: str, cell: Callable[[RunRecords], str]) -> list[str]:
    header = f"| {title} | " + " | ".join(grid.settings) + " |"
    rule = "|---|" + "|".join("---:" for _ in grid.settings) + "|"
    lines = [header, rule]
    for method in grid.methods:
        cells = []
        for setting in grid.settings:
            run = grid.get(method, setting)
            cells.append(MISSING if run is None else cell(run))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def table3_markdown(grid: PaperGrid) -> str:
    """Table 3's layout: a block of final test accuracy (%) and one of simulated latency (hours), methods x
    settings; ``—`` where a method did not run in a setting."""
    lines = _block(grid, "Accuracy (%)", lambda run: _percent(run.final_test_acc))
    lines += [""]
    lines += _block(grid, "Latency (sim. hours)", lambda run: _hours(run.sim_time_s))
    return "\n".join(lines) + "\n"


def utilisation_markdown(grid: PaperGrid) -> str:
    """Figure 6's numbers: mean memory and bandwidth utilisation (%) per method and setting."""
    lines = _block(grid, "Memory utilisation (%)", lambda run: _percent(_mean_column(run, "memory_util")))
    lines += [""]
    lines += _block(grid, "Bandwidth utilisation (%)", lambda run: _percent(_mean_column(run, "bandwidth_util")))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- figures
UTILISATION_AXIS_PCT = 150.0  # bars above it (methods that ignore budgets) are cut there and labelled with their value


def plot_utilisation(grid: PaperGrid, out_png: str | Path) -> Path:
    """Figure 6: grouped bars of mean memory (top) and bandwidth (bottom) utilisation, one group per setting and one
    bar per method; a missing run or a run without the column leaves a gap. The axis stops at 150%: a method that
    ignores budgets (FedAvg "Largest") can need many times a budget, and its bar is cut there with its value on top."""
    out_path = Path(out_png)
    figure = Figure(figsize=(max(6.0, 1.6 * len(grid.settings) + 3.0), 7.0), dpi=100)
    FigureCanvasAgg(figure)
    width = 0.8 / max(1, len(grid.methods))
    for row, (column, title) in enumerate((("memory_util", "Memory"), ("bandwidth_util", "Bandwidth"))):
        axes = figure.add_subplot(2, 1, row + 1)
        top = 0.0
        for i, method in enumerate(grid.methods):
            xs, ys = [], []
            for j, setting in enumerate(grid.settings):
                run = grid.get(method, setting)
                value = None if run is None else _mean_column(run, column)
                if value is not None:
                    xs.append(j - 0.4 + (i + 0.5) * width)
                    ys.append(100.0 * value)
            bars = axes.bar(xs, [min(y, UTILISATION_AXIS_PCT) for y in ys], width=width, label=method)
            for bar, y in zip(bars, ys, strict=True):
                if y > UTILISATION_AXIS_PCT:
                    axes.text(
                        bar.get_x() + bar.get_width() / 2,
                        UTILISATION_AXIS_PCT,
                        f"{y:.0f}%",
                        ha="center",
                        va="bottom",
                        fontsize="x-small",
                        rotation=90,
                    )
            top = max([top, *ys])
        axes.set_ylim(0.0, min(max(top, 100.0), UTILISATION_AXIS_PCT) * 1.15)
        axes.set_xticks(range(len(grid.settings)), list(grid.settings))
        axes.set_ylabel(f"{title} utilisation (%)")
        axes.grid(True, axis="y", alpha=0.3)
        if row == 0:
            axes.set_title("Mean utilisation of the clients that trained")
            axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    figure.tight_layout()
    replace_file(out_path, lambda tmp: figure.savefig(tmp, format="png"))
    log.info("wrote %s", out_path)
    return out_path


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "setting"


def plot_setting_curves(grid: PaperGrid, out_dir: str | Path) -> list[Path]:
    """Figure 12: per setting, ``accuracy_vs_rounds_<setting>.png`` and, when some run has simulated time,
    ``accuracy_vs_sim_hours_<setting>.png``, one line per method."""
    target = Path(out_dir)
    pngs: list[Path] = []
    for setting in grid.settings:
        pairs = grid.runs_of(setting)
        labels = [method for method, _ in pairs]
        runs = [run for _, run in pairs]
        slug = _slug(setting)
        title = f"{setting}: "
        rounds_png = target / f"accuracy_vs_rounds_{slug}.png"
        pngs.append(plot_accuracy(runs, rounds_png, "round_idx", labels, title, shared_baseline=True))
        if any(run.sim_time_s > 0 for run in runs):
            png = target / f"accuracy_vs_sim_hours_{slug}.png"
            pngs.append(plot_accuracy(runs, png, "sim_hours", labels, title, shared_baseline=True))
    return pngs
