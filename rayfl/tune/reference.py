"""The sweep file's reference, generated from its dataclasses (``SweepConfig`` and the sections below it) by the same
walk as the experiment's (``rayfl/experiment/reference.py``): every field with its type, default, bounds and doc.

``docs/sweep-reference.md`` is this module's output (``python -m rayfl.tune.reference > docs/sweep-reference.md``); a
test keeps the two in sync. Imports neither torch nor Ray.
"""

from __future__ import annotations

from rayfl.experiment.reference import render_tables
from rayfl.tune.metrics import REPORTED_METRICS, TABLE_METRICS
from rayfl.tune.space import DISTRIBUTIONS
from rayfl.tune.spec import OWNED_KEYS, SweepConfig

__all__ = ["render_sweep_reference"]


def render_sweep_reference() -> str:
    """The whole sweep-file reference as Markdown (what ``docs/sweep-reference.md`` holds)."""
    owned = ", ".join(f"`{k}`" for k in OWNED_KEYS)
    kinds = ", ".join(f"`{k}`" for k in DISTRIBUTIONS)
    lines = [
        "# Sweep file reference",
        "",
        "Generated from the sweep file's dataclasses by `python -m rayfl.tune.reference` (a test keeps this file in",
        "sync: regenerate it after changing `rayfl/tune/spec.py` or `rayfl/tune/resources.py`). `rayfl sweep FILE`",
        "reads a YAML file with the keys below; how a sweep runs is in [Sweeps](sweeps.md), every key of the base",
        "experiment in the [config reference](config-reference.md).",
        "",
        "Command-line overrides of a sweep: `base.KEY=V` overrides the base experiment, `param_space.KEY=V` sets one",
        "swept entry (`KEY` dotted as in the file, `V` written as in YAML), and any other `a.b=V` sets a key of the",
        "sweep file itself (`num_samples=2`, `scheduler.max_t_s=100`).",
        "",
        "## `param_space` entries",
        "",
        "Each entry maps a dotted experiment key (`algorithm.epsilon`, `seed`) to its values, one of",
        f"{kinds}:",
        "",
        "| Written | Values |",
        "|---|---|",
        "| `[a, b, c]` or `{grid: [a, b, c]}` | every value, crossed with the other grids (a grid search) |",
        "| `{choice: [a, b, c]}` | one value drawn per sample (`search: random`) |",
        "| `{uniform: [lo, hi]}` | a float drawn per sample (`search: random`) |",
        "| `{loguniform: [lo, hi]}` | a float drawn per sample on a log scale, `0 < lo` (`search: random`) |",
        "| `{randint: [lo, hi]}` | an integer in `[lo, hi)`, Tune's convention (`search: random`) |",
        "",
        "Drawn values need `search: random`; Tune then makes `num_samples` draws per grid point. A trial's values",
        "become `key=value` overrides of the base experiment, keys ending in `name` first (switching",
        f"`algorithm.name` happens before that section's other keys are set). The sweep sets {owned} of every",
        "trial itself, so neither may be swept or overridden. Every trial's experiment config is loaded and checked",
        "before Tune starts.",
        "",
        "## Metrics",
        "",
        "`metric` and `plot.metrics` name columns of the results table (`results.csv`, one row per trial):",
        ", ".join(f"`{m}`" for m in TABLE_METRICS) + ".",
        "`scheduler.metric` names a value every trial reports to Tune each round:",
        ", ".join(f"`{m}`" for m in REPORTED_METRICS) + ".",
        "",
    ]
    return "\n".join(lines + render_tables(SweepConfig))


if __name__ == "__main__":
    print(render_sweep_reference(), end="")
