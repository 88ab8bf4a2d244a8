"""The FedHeN comparison table (paper 001's quantities) from the runs of experiments/fedhen/run_all.sh.

python experiments/fedhen/table.py runs/fedhen [curves.png] > experiments/fedhen/results.md

Per setting and method: the simple model's and the complex model's test accuracy at the last round, their mean over
the last five evaluations (the curves are noisy with 10 of 100 clients per round), and the first round at which each
reached a target (the paper's Tables 1-2 count rounds to a target accuracy; here the target is 0.9 x the best final
accuracy of any method on that model and setting). "Devices" is the engine's ``device_acc`` at the last evaluation:
the mean over the 100 devices of the accuracy of the model each one runs (50 simple, 50 complex); it is *not* the
paper's reporting model (the average of every device's latest local model), which needs each device's model kept
across rounds. FedHeN, NoSide and Decouple all record the simple model as ``simple`` in evals.csv and the complex one
as ``test_acc``. With a second argument, the accuracy curves against rounds (setting x model) go to that PNG.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

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
        "devices": [float(r.get("device_acc") or "nan") for r in rounds],
    }


def _first_reaching(curve: list[tuple[int, float]], target: float) -> str:
    for round_no, acc in curve:
        if acc >= target:
            return str(round_no)
    return "-"


def main(root: Path) -> list[dict[str, object]]:
    runs = [_read(p.parent) for p in sorted(root.rglob("evals.csv"))]
    header = ["setting", "method"]
    for model in ("simple", "complex"):
        header += [f"{model}: last", f"{model}: mean of last {LAST}", f"{model}: rounds to target"]
    header.append("devices: last")
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
            devices: list[float] = r["devices"]  # type: ignore[assignment]
            cells.append(f"{devices[-1]:.3f}" if devices else "-")
            print("| " + " | ".join(cells) + " |")
    print()
    print("Targets (0.9 x the best last accuracy of any method): " + "; ".join(notes) + ".")
    return runs


def plot(runs: list[dict[str, object]], path: Path) -> None:
    """Accuracy against rounds: one panel per setting and model, one line per method."""
    settings = sorted({str(r["setting"]) for r in runs})
    fig = Figure(figsize=(10, 3.6 * len(settings)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(settings), 2, squeeze=False)
    for i, setting in enumerate(settings):
        for j, model in enumerate(("simple", "complex")):
            ax = axes[i][j]
            for r in sorted((r for r in runs if r["setting"] == setting), key=lambda r: str(r["method"])):
                curve: list[tuple[int, float]] = r[model]  # type: ignore[assignment]
                ax.plot([c[0] for c in curve], [c[1] for c in curve], label=str(r["method"]))
            ax.set_title(f"{setting}: {model} model")
            ax.set_xlabel("Round")
            ax.set_ylabel("Test accuracy")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    found = main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fedhen"))
    if len(sys.argv) > 2:
        plot(found, Path(sys.argv[2]))
