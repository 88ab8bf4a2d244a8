"""The report's section on a multi-phase run: each phase's rounds, simulated time and last accuracy, and the per-tier
results FedorAS's phases report (``summary.json`` ``phases[k].result.tiers``: the search's chosen paths, the
fine-tuned tier models)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rayfl.report.runs import RunRecords

__all__ = ["phases_markdown"]

_TIER_COLUMNS = (
    ("tier", "tier", "{}"),
    ("clients", "clients", "{}"),
    ("eligible_clients", "eligible clients", "{}"),
    ("flops", "MFLOPs", "{:.2f}"),
    ("params", "params", "{:,.0f}"),
    ("val_acc", "val acc", "{:.1%}"),
    ("test_acc", "test acc", "{:.1%}"),
    ("path", "path", "{}"),
)


def phases_markdown(run: RunRecords) -> str | None:
    """Markdown for the phases of ``run`` (None for a run without phases)."""
    phases = run.summary.get("phases")
    if not phases:
        return None
    lines = [
        "| phase | algorithm | rounds | simulated time (s) | last test acc |",
        "|---|---|---|---|---|",
    ]
    for phase in phases:
        acc = phase.get("final_test_acc")
        shown = f"{acc:.1%}" if isinstance(acc, float) and acc == acc else "-"
        lines.append(
            f"| {phase['name']} | {phase['algorithm']} | {phase['rounds']} | {phase['sim_time_s']:.1f} | {shown} |"
        )
    for phase in phases:
        tiers = (phase.get("result") or {}).get("tiers")
        if tiers:
            settings = ", ".join(f"{k}: {v}" for k, v in phase["result"].items() if k != "tiers")
            title = f"Per tier, phase {phase['name']}" + (f" ({settings})" if settings else "")
            lines += ["", f"{title}:", "", _tier_table(tiers)]
    return "\n".join(lines) + "\n"


def _tier_table(tiers: Sequence[Mapping[str, Any]]) -> str:
    columns = [(key, title, fmt) for key, title, fmt in _TIER_COLUMNS if any(key in t for t in tiers)]
    rows = ["| " + " | ".join(title for _, title, _ in columns) + " |", "|" + "---|" * len(columns)]
    for tier in tiers:
        cells = []
        for key, _, fmt in columns:
            value = tier.get(key)
            if value is None:
                cells.append("-")
            elif key == "flops":
                cells.append(fmt.format(value / 1e6))
            elif key == "path":
                cells.append(" ".join(value))
            else:
                cells.append(fmt.format(value))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
