"""The distillation sweep's table (experiments/sweeps/distill_mini.yaml) beside the run without distillation.

    python experiments/distill/sweep_table.py runs/sweeps/distill-mini [--reference DIR] [--out FILE]

One row per trial: its swept values, the test accuracy at its last round and the mean over its last three
evaluations, and that mean minus the same figure of the reference (default: the mini re-run's core method without
distillation, ``runs/distill/mini/mini-model_search-no-distill``, cut at the trials' round count: the mini setting has
no learning-rate schedule, so its first R rounds are exactly an R-round run). Then each factor's main effect: the mean
of that difference over the trials at each of its levels. Trials still running or missing are left out.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import yaml

KEYS = (("lr", "lr"), ("iterations", "T_SKD"), ("subnets", "n"), ("temperature", "temperature"))


def accuracies(rounds_csv: Path, rounds: int | None = None) -> tuple[list[float], int]:
    with rounds_csv.open() as f:
        rows = [r for r in csv.DictReader(f) if rounds is None or int(r["round_idx"]) < rounds]
    accs = [float(r["test_acc"]) for r in rows if r["test_acc"] not in ("", "nan")]
    return [a for a in accs if not math.isnan(a)], len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--reference", type=Path, default=Path("runs/distill/mini/mini-model_search-no-distill"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trials = []
    for trial in sorted((args.sweep / "trials").iterdir()):
        if not (trial / "summary.json").exists():
            continue
        distill = yaml.safe_load((trial / "config.yaml").read_text())["algorithm"]["distill"]
        accs, rounds = accuracies(trial / "rounds.csv")
        if accs:
            trials.append(({k: distill[k] for k, _ in KEYS}, accs[-1], sum(accs[-3:]) / len(accs[-3:]), rounds))
    if not trials:
        raise SystemExit(f"no finished trial under {args.sweep}")
    rounds = trials[0][3]
    ref_accs, _ = accuracies(args.reference / "rounds.csv", rounds)
    ref = sum(ref_accs[-3:]) / len(ref_accs[-3:])
    lines = [
        f"Core method on mini, {rounds} rounds; reference without distillation: {100 * ref_accs[-1]:.1f}% at the last "
        f"round, {100 * ref:.1f}% over the last three evaluations.",
        "",
        "| " + " | ".join(label for _, label in KEYS) + " | test acc (last) | mean of last 3 | vs no distillation |",
        "|" + "---|" * (len(KEYS) + 3),
    ]
    for values, last, mean, _ in sorted(trials, key=lambda t: -t[2]):
        cells = " | ".join(f"{values[k]:g}" for k, _ in KEYS)
        lines.append(f"| {cells} | {100 * last:.1f} | {100 * mean:.1f} | {100 * (mean - ref):+.1f} |")
    lines += ["", "Main effects (mean change against no distillation, points, over the trials at each level):", ""]
    for key, label in KEYS:
        levels = sorted({t[0][key] for t in trials})
        parts = []
        for level in levels:
            diffs = [100 * (t[2] - ref) for t in trials if t[0][key] == level]
            parts.append(f"{label} = {level:g}: {sum(diffs) / len(diffs):+.1f} ({len(diffs)} trials)")
        lines.append("- " + "; ".join(parts))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
