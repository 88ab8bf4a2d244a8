"""Issue 17's re-run tables from the run directories of experiments/distill/rerun.sh.

    python experiments/distill/tables.py [--runs runs/distill] [--previous FILE] [--out experiments/distill/results.md]

Rows: the methods of paper 000's Table 3 that the re-run covers; columns: mini and the six CPU settings. Each cell is
the test accuracy at the last round and, in brackets, the mean over the last three evaluations (a less noisy figure
for ten-client rounds). A row below gives each setting's most-frequent-label accuracy (what a model that always
predicts the commonest test label scores: "chance"). Below the table: the differences that decide paper 000's
orderings (core method minus HeteroFL; with minus without distillation, for both), on the mean of the last three
evaluations; then, where ``RUNS/seed1`` holds second-seed runs (``rerun.sh seeds``), both seeds of the key methods,
the same differences per seed and each seed's chance (the seed draws the data split too).

``--previous``: an earlier results.md of this script; a cell with no run under ``--runs`` takes its value from there,
marked ``*`` (runs that were not repeated because their code and config did not change). Missing runs are otherwise
left blank, so the script can be run while the re-run is under way.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
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
SEED_METHODS = ("model_search", "model_search-no-distill", "heterofl")
SEED_DIFFS = (DIFFS[1], DIFFS[2])

# (last accuracy, mean of the last three evaluations), as fractions; ``from_previous`` marks cells not re-run
Cell = tuple[float, float]


def run_dir(runs: Path, setting: str, method: str) -> Path:
    if setting == "mini":
        return runs / "mini" / f"mini-{method}"
    return runs / "paper-cpu" / setting / f"{setting}-{method}"


def accuracies(path: Path) -> Cell | None:
    """(last accuracy, mean of the last three evaluations) of a finished run, or None."""
    if not (path / "summary.json").exists():
        return None
    with (path / "rounds.csv").open() as f:
        rows = list(csv.DictReader(f))
    accs = [float(r["test_acc"]) for r in rows if r["test_acc"] not in ("", "nan")]
    accs = [a for a in accs if not math.isnan(a)]
    if not accs:
        return None
    return accs[-1], sum(accs[-3:]) / len(accs[-3:])


def chance(runs: Path, setting: str) -> float | None:
    """The most-frequent-label accuracy of the setting's test set, from any finished run of it."""
    for method, _ in METHODS:
        path = run_dir(runs, setting, method) / "summary.json"
        if path.exists():
            return float(json.loads(path.read_text())["baseline_acc"])
    return None


def previous_cells(path: Path) -> dict[tuple[str, str], Cell]:
    """The cells of an earlier results.md (its first table), by (setting, method)."""
    labels = {label: method for method, label in METHODS}
    cells: dict[tuple[str, str], Cell] = {}
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if not parts or parts[0] not in labels:
            continue
        for (setting, _), text in zip(SETTINGS, parts[1:], strict=False):
            found = re.fullmatch(r"([\d.]+)\*? \[([\d.]+)\]", text)
            if found:
                cells[(setting, labels[parts[0]])] = (float(found[1]) / 100, float(found[2]) / 100)
    return cells


def table(header: str, rows: list[tuple[str, list[str]]]) -> list[str]:
    lines = [f"| {header} | " + " | ".join(label for _, label in SETTINGS) + " |", "|---|" + "---|" * len(SETTINGS)]
    return lines + [f"| {label} | " + " | ".join(row) + " |" for label, row in rows if any(row)]


def diff_row(cells: dict[tuple[str, str], Cell | None], a: str, b: str) -> list[str]:
    out = []
    for setting, _ in SETTINGS:
        x, y = cells.get((setting, a)), cells.get((setting, b))
        out.append("" if x is None or y is None else f"{100 * (x[1] - y[1]):+.1f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=Path, default=Path("runs/distill"))
    parser.add_argument("--previous", type=Path)
    parser.add_argument("--out", type=Path, default=Path("experiments/distill/results.md"))
    args = parser.parse_args()
    ran = {(s, m): accuracies(run_dir(args.runs, s, m)) for s, _ in SETTINGS for m, _ in METHODS}
    earlier = previous_cells(args.previous) if args.previous else {}
    cells = {key: ran[key] or earlier.get(key) for key in ran}
    rows = []
    for method, label in METHODS:
        row = []
        for setting, _ in SETTINGS:
            got, mark = cells[(setting, method)], "" if ran[(setting, method)] else "*"
            row.append("" if got is None else f"{100 * got[0]:.1f}{mark} [{100 * got[1]:.1f}]")
        rows.append((label, row))
    chances = [chance(args.runs, s) for s, _ in SETTINGS]
    rows.append(("most-frequent label (chance)", ["" if c is None else f"{100 * c:.1f}" for c in chances]))
    lines = ["Test accuracy (%) at the last round [mean of the last three evaluations]; blank: not run."]
    if earlier:
        lines.append(f"`*`: not re-run, the value of `{args.previous}` (its runs' code and config are unchanged).")
    lines += ["", *table("method", rows), "", "Differences in points (mean of the last three evaluations):", ""]
    lines += table("difference", [(label, diff_row(cells, a, b)) for label, a, b in DIFFS])
    seed1 = {(s, m): accuracies(run_dir(args.runs / "seed1", s, m)) for s, _ in SETTINGS for m in SEED_METHODS}
    # settings with a second-seed run of any key method (a method without one is left blank there)
    seeded = {s for s, _ in SETTINGS if any(seed1[(s, m)] and cells[(s, m)] for m in SEED_METHODS)}
    if seeded:
        zero = {k: v for k, v in cells.items() if k[0] in seeded}
        one = {k: v for k, v in seed1.items() if k[0] in seeded}
        seed_rows = []
        for method in SEED_METHODS:
            for label, source in (("seed 0", zero), ("seed 1", one)):
                row = [f"{100 * got[1]:.1f}" if (got := source.get((s, method))) else "" for s, _ in SETTINGS]
                seed_rows.append((f"{dict(METHODS)[method]}, {label}", row))
            change = [
                f"{100 * (b[1] - a[1]):+.1f}" if (a := zero.get((s, method))) and (b := one.get((s, method))) else ""
                for s, _ in SETTINGS
            ]
            seed_rows.append((f"{dict(METHODS)[method]}, seed 1 - seed 0", change))
        for label, a, b in SEED_DIFFS:
            seed_rows += [(f"{label}, seed 0", diff_row(zero, a, b)), (f"{label}, seed 1", diff_row(one, a, b))]
        for label, root in (("seed 0", args.runs), ("seed 1", args.runs / "seed1")):  # the seed draws the split too
            row = [f"{100 * c:.1f}" if s in seeded and (c := chance(root, s)) is not None else "" for s, _ in SETTINGS]
            seed_rows.append((f"most-frequent label (chance), {label}", row))
        lines += ["", "Two seeds (seed 1: `rerun.sh seeds`), mean of the last three evaluations, in % and points:", ""]
        lines += table("method / difference", seed_rows)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
