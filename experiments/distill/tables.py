"""Issue 17's re-run tables from the run directories of experiments/distill/rerun.sh.

    python experiments/distill/tables.py [--runs runs/distill] [--out experiments/distill/results.md]

Rows: the methods of paper 000's Table 3 that the re-run covers; columns: mini and the six CPU settings. Each cell is
the test accuracy at the last round and, in brackets, the mean over the last three evaluations (a less noisy figure
for ten-client rounds). Below the table: the differences that decide paper 000's orderings (core method minus
HeteroFL; with minus without distillation, for both), on the mean of the last three evaluations. Missing runs are
left blank, so the script can be run while the re-run is under way.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

METHODS = (
    ("model_search", "Ours (w/)"),
    ("model_search-no-distill", "Ours (w/o)"),
    ("model_search-copies", "Ours (w/, copy-and-average distillation)"),
    ("model_search-frozen", "Ours (w/, Eq. 2 with the teacher frozen per round)"),
    ("heterofl-distill", "HeteroFL (w/)"),
    ("heterofl", "HeteroFL (w/o)"),
    ("fedrolex", "FedRolex"),
    ("fjord", "FjORD"),
    ("smallest", "FedAvg smallest"),
    ("largest", "FedAvg largest"),
)
SETTINGS = (("mini", "mini"), *((f"setting{n}", f"setting {n}") for n in range(1, 7)))
DIFFS = (
    ("Ours (w/) - HeteroFL (w/)", "model_search", "heterofl-distill"),
    ("Ours (w/o) - HeteroFL (w/o)", "model_search-no-distill", "heterofl"),
    ("Ours: w/ - w/o distillation", "model_search", "model_search-no-distill"),
    ("HeteroFL: w/ - w/o distillation", "heterofl-distill", "heterofl"),
)


def run_dir(runs: Path, setting: str, method: str) -> Path:
    if setting == "mini":
        return runs / "mini" / f"mini-{method}"
    return runs / "paper-cpu" / setting / f"{setting}-{method}"


def accuracies(path: Path) -> tuple[float, float, int] | None:
    """(last accuracy, mean of the last three evaluations, rounds) of a finished run, or None."""
    if not (path / "summary.json").exists():
        return None
    with (path / "rounds.csv").open() as f:
        rows = list(csv.DictReader(f))
    accs = [float(r["test_acc"]) for r in rows if r["test_acc"] not in ("", "nan")]
    accs = [a for a in accs if not math.isnan(a)]
    if not accs:
        return None
    return accs[-1], sum(accs[-3:]) / len(accs[-3:]), len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=Path, default=Path("runs/distill"))
    parser.add_argument("--out", type=Path, default=Path("experiments/distill/results.md"))
    args = parser.parse_args()
    cells = {(s, m): accuracies(run_dir(args.runs, s, m)) for s, _ in SETTINGS for m, _ in METHODS}
    lines = [
        "Test accuracy (%) at the last round [mean of the last three evaluations]; blank: not run.",
        "",
        "| method | " + " | ".join(label for _, label in SETTINGS) + " |",
        "|---|" + "---|" * len(SETTINGS),
    ]
    for method, label in METHODS:
        row = []
        for setting, _ in SETTINGS:
            got = cells[(setting, method)]
            row.append("" if got is None else f"{100 * got[0]:.1f} [{100 * got[1]:.1f}]")
        if any(row):
            lines.append(f"| {label} | " + " | ".join(row) + " |")
    lines += ["", "Differences in points (mean of the last three evaluations):", ""]
    lines += ["| difference | " + " | ".join(label for _, label in SETTINGS) + " |", "|---|" + "---|" * len(SETTINGS)]
    for label, a, b in DIFFS:
        row = []
        for setting, _ in SETTINGS:
            x, y = cells[(setting, a)], cells[(setting, b)]
            row.append("" if x is None or y is None else f"{100 * (x[1] - y[1]):+.1f}")
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
