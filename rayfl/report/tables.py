"""A Markdown comparison table with one row per run."""

from __future__ import annotations

from collections.abc import Sequence

from rayfl.core.units import format_sim_time
from rayfl.report.runs import RunRecords, unique_labels

__all__ = [
    "BASELINE_FLAG",
    "COST_COLUMNS",
    "MISSING",
    "SYSTEM_COLUMNS",
    "TABLE_COLUMNS",
    "cost_table",
    "format_percent",
    "markdown_table",
    "system_table",
]

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
    "Sim time",
    "Wall time (s)",
    "MB moved",
    "Mem util",
    "BW util",
    "Failed",
    "Over budget",
    "Structures",
)

_RIGHT_ALIGNED = frozenset(TABLE_COLUMNS[4:])

SYSTEM_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, rounds column, format)
    ("Round", "round_idx", "d"),
    ("Sim time", "sim_time_s", "t"),
    ("Duration", "sim_duration_s", "t"),
    ("Sampled", "clients_sampled", "d"),
    ("Run", "clients_run", "d"),
    ("Failed: memory", "failed_memory", "d"),
    ("bandwidth", "failed_bandwidth", "d"),
    ("memory dip", "failed_memory_dip", "d"),
    ("no network", "failed_no_network", "d"),
    ("unavailable", "failed_unavailable", "d"),
    ("other", "failed_other", "d"),
    ("Mem util", "memory_util", "%"),
    ("BW util", "bandwidth_util", "%"),
    ("Test acc", "test_acc", "%"),
)


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
        format_percent(run.final_test_acc) + _flag(run.final_test_acc, run.baseline_acc),
        format_percent(run.best_test_acc),
        format_percent(run.baseline_acc),
        _number(run.final_test_loss, ".4f"),
        format_sim_time(run.sim_time_s),
        _number(run.wall_time_s, ".1f"),
        _number(None if total_bytes is None else total_bytes / 1e6, ".2f"),
        format_percent(_mean(run, "memory_util")),
        format_percent(_mean(run, "bandwidth_util")),
        _failed(run),
        _number(run.over_budget, "d"),
        _number(run.distinct_structures, "d"),
    ]


BASELINE_FLAG = " (<= baseline)"


def _flag(accuracy: float | None, baseline: float | None) -> str:
    """``BASELINE_FLAG`` when ``accuracy`` is known and at most the most-frequent-label ``baseline``."""
    at_most = accuracy is not None and baseline is not None and accuracy <= baseline + 1e-12
    return BASELINE_FLAG if at_most else ""


def _mean(run: RunRecords, column: str) -> float | None:
    values = run.column(column)
    if values is None:
        return None
    finite = values.dropna()
    return float(finite.mean()) if len(finite) else None


def _failed(run: RunRecords) -> str:
    failed, sampled = run.column("clients_failed"), run.column("clients_sampled")
    if failed is None or sampled is None or sampled.sum() == 0:
        return MISSING
    return f"{int(failed.sum())}/{int(sampled.sum())}"


def _format(value: object, spec: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return MISSING
    if spec == "%":
        return format_percent(float(value))  # type: ignore[arg-type]
    if spec == "t":
        return format_sim_time(float(value))  # type: ignore[arg-type]
    if spec == "d":
        return str(int(value))  # type: ignore[call-overload]
    return format(float(value), spec)  # type: ignore[arg-type]


def system_table(run: RunRecords) -> str | None:
    """Per round: simulated time and duration, clients sampled, run and failed by cause, utilisation, accuracy.

    ``None`` when the run has no system columns (written before the simulated clock existed).
    """
    present = [c for c in SYSTEM_COLUMNS if run.column(c[1]) is not None]
    if run.column("sim_duration_s") is None:
        return None
    header = "| " + " | ".join(c[0] for c in present) + " |"
    rule = "|" + "|".join("---:" for _ in present) + "|"
    columns = [run.column(c[1]) for c in present]
    lines = [header, rule]
    for i in range(run.rounds_run):
        cells = [
            _format(col.iloc[i] if col is not None else None, c[2]) for col, c in zip(columns, present, strict=True)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown_table(runs: Sequence[RunRecords]) -> str:
    """A GitHub-flavoured Markdown table comparing ``runs``, one row each, in the order given.

    Accuracies are percentages with two decimals; "Final acc" is the last evaluated round, "Best acc" the best
    one, and a final accuracy at or below the most-frequent-label baseline is flagged ``(<= baseline)``: such a run
    learned nothing a constant guess does not. "Sim time" is simulated time in s, min or h (``0.000 s`` while the
    simulated clock is off), "MB moved" is bytes down plus
    bytes up over all rounds in units of 10^6 bytes. Unknown values show as ``—``. Runs that share a name are
    told apart by their directory name. The text ends with a newline.
    """
    header = "| " + " | ".join(TABLE_COLUMNS) + " |"
    rule = "|" + "|".join("---:" if col in _RIGHT_ALIGNED else "---" for col in TABLE_COLUMNS) + "|"
    lines = [header, rule]
    for label, run in zip(unique_labels(runs), runs, strict=True):
        lines.append("| " + " | ".join(_row(label, run)) + " |")
    return "\n".join(lines) + "\n"


COST_COLUMNS: tuple[str, ...] = (
    "Run",
    "Client acc",
    "IQR",
    "Models",
    "Model accs",
    "Train GMACs",
    "Network MB",
)


def _iqr(run: RunRecords) -> float | None:
    rows = run.client_accs()
    if rows is None:
        return None
    q1, q3 = rows["test_acc"].astype(float).quantile([0.25, 0.75])
    return float(q3 - q1)


def _model_accs(run: RunRecords) -> str | None:
    if "model_accs" not in run.rounds.columns:
        return None
    texts = [str(t) for t in run.rounds["model_accs"] if isinstance(t, str) and t.strip()]
    if not texts:
        return None
    return " / ".join(f"{100.0 * float(a):.1f}" for a in texts[-1].split())


def cost_table(runs: Sequence[RunRecords]) -> str:
    """Paper 002's comparison: the average client accuracy at the last evaluated round and the spread of the clients'
    accuracies (interquartile range, percentage points), the global models at the end and each one's accuracy (%),
    the clients' training multiply-accumulates over the run (3 x forward MACs x samples) and the bytes moved."""
    header = "| " + " | ".join(COST_COLUMNS) + " |"
    rule = "|---|" + "|".join("---:" for _ in COST_COLUMNS[1:]) + "|"
    lines = [header, rule]
    for label, run in zip(unique_labels(runs), runs, strict=True):
        iqr, macs, total_bytes = _iqr(run), run.total_train_macs, run.total_bytes
        cells = [
            _cell(label),
            format_percent(run.final_client_acc),
            _number(None if iqr is None else 100.0 * iqr, ".2f"),
            _number(run.num_models, "d"),
            _cell(_model_accs(run)),
            _number(None if macs is None else macs / 1e9, ".1f"),
            _number(None if total_bytes is None else total_bytes / 1e6, ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
