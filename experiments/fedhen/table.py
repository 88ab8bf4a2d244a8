"""The FedHeN comparison table (paper 001's quantities) from the runs of experiments/fedhen/run_all.sh.

python experiments/fedhen/table.py runs/fedhen > experiments/fedhen/results.md

Per setting and method: the simple model's and the complex model's test accuracy at the last round, their mean over
the last five evaluations (the curves are noisy with 10 of 100 clients per round), and the first round at which each
reached a target (the paper's Tables 1-2 count rounds to a target accuracy; here the target is 0.9 x the best final
accuracy of any method on that model and setting).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import yaml

LAST = 5


def _read(run_dir: Path) -> dict[str, object]:
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    rounds = [r for r in csv.DictReader((run_dir / "rounds.csv").open()) if r["test_acc"] not in ("", "nan")]
    simple = [r for r in csv.DictReader((run_dir / "evals.csv").open()) if r["name"] == "simple"]
    return {
        "setting": cfg.get("setting") or run_dir.parent.name,
        "method": cfg["algorithm"]["name"],
        "complex": [(int(r["round_idx"]) + 1, float(r["test_acc"])) for r in rounds],
        "simple": [(int(r["round_idx"]) + 1, float(r["test_acc"])) for r in simple],
    }


def _first_reaching(curve: list[tuple[int, float]], target: float) -> str:
    for round_no, acc in curve:
        if acc >= target:
            return str(round_no)
    return "-"


def main(root: Path) -> None:
    runs = [_read(p.parent) for p in sorted(root.rglob("evals.csv"))]
    header = ["setting", "method"]
    for model in ("simple", "complex"):
        header += [f"{model}: last", f"{model}: mean of last {LAST}", f"{model}: rounds to target"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    notes = []
    for setting in sorted({str(r["setting"]) for r in runs}):
        group = [r for r in runs if r["setting"] == setting]
        targets = {}
        for model in ("simple", "complex"):
            finals = [curve[-1][1] for r in group if (curve := r[model])]  # type: ignore[index]
            targets[model] = 0.9 * max(finals) if finals else float("nan")
        notes.append(f"{setting}: simple {targets['simple']:.3f}, complex {targets['complex']:.3f}")
        for r in sorted(group, key=lambda r: str(r["method"])):
            cells = [setting, str(r["method"])]
            for model in ("simple", "complex"):
                curve: list[tuple[int, float]] = r[model]  # type: ignore[assignment]
                if not curve:
                    cells += ["-", "-", "-"]
                    continue
                tail = [acc for _, acc in curve[-LAST:]]
                cells += [f"{curve[-1][1]:.3f}", f"{sum(tail) / len(tail):.3f}", _first_reaching(curve, targets[model])]
            print("| " + " | ".join(cells) + " |")
    print()
    print("Targets (0.9 x the best last accuracy of any method): " + "; ".join(notes) + ".")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fedhen"))
