"""A Markdown comparison table with one row per run."""

from __future__ import annotations

from collections.abc import Sequence

from rayfl.report.runs import RunRecords, unique_labels

__all__ = ["MISSING", "TABLE_COLUMNS", "format_percent", "markdown_table"]

MISSING = "—"
"""What a cell shows when the run did not record the quantity."""

TABLE_COLUMNS: tuple[str, ...] = (
    "Run",
    "Algorithm",
    "Model",
    "Data",
    "Rounds",
    "Final acc",
    "Best acc",
    "Baseline acc",
    "Final loss",
    "Sim hours",
    "Wall time (s)",
    "MB moved",
)

_RIGHT_ALIGNED = frozenset(TABLE_COLUMNS[4:])


def format_percent(fraction: float | None) -> str:
    """An accuracy in [0, 1] as a percentage with two decimals (``0.8123`` -> ``"81.23%"``)."""
    return MISSING if fraction is None else f"{100.0 * fraction:.2f}%"


def _number(value: float | None, spec: str) -> str:
    return MISSING if value is None else format(value, spec)


def _cell(text: str | None) -> str:
    """Text made safe for a Markdown table cell (pipes escaped, line breaks flattened)."""
    if text is None or text == "":
        return MISSING
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _row(label: str, run: RunRecords) -> list[str]:
    total_bytes = run.total_bytes
    return [
        _cell(label),
        _cell(run.algorithm),
        _cell(run.model_name),
        _cell(run.data_name),
        str(run.rounds_run),
        format_percent(run.final_test_acc),
        format_percent(run.best_test_acc),
        format_percent(run.baseline_acc),
        _number(run.final_test_loss, ".4f"),
        f"{run.sim_time_s / 3600.0:.2f}",
        _number(run.wall_time_s, ".1f"),
        _number(None if total_bytes is None else total_bytes / 1e6, ".2f"),
    ]


def markdown_table(runs: Sequence[RunRecords]) -> str:
    """A GitHub-flavoured Markdown table comparing ``runs``, one row each, in the order given.

    Accuracies are percentages with two decimals; "Final acc" is the last evaluated round, "Best acc" the best
    one. "Sim hours" is simulated time (0.00 while the simulated clock is off), "MB moved" is bytes down plus
    bytes up over all rounds in units of 10^6 bytes. Unknown values show as ``—``. Runs that share a name are
    told apart by their directory name. The text ends with a newline.
    """
    header = "| " + " | ".join(TABLE_COLUMNS) + " |"
    rule = "|" + "|".join("---:" if col in _RIGHT_ALIGNED else "---" for col in TABLE_COLUMNS) + "|"
    lines = [header, rule]
    for label, run in zip(unique_labels(runs), runs, strict=True):
        lines.append("| " + " | ".join(_row(label, run)) + " |")
    return "\n".join(lines) + "\n"
