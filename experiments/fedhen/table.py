"""The FedHeN comparison tables (paper 001's quantities) from the runs of experiments/fedhen/run_all.sh.

python experiments/fedhen/table.py runs/fedhen [curves.png] > experiments/fedhen/results.md

Two views of every method's models, each as the mean and the spread over the seeds found (``mean ± sd``: the sample
standard deviation over seeds; a single seed shows no spread):

* **Global models** (rayfl's usual figures): the server's simple model (``simple`` in evals.csv) and complex model
  (``test_acc``) after each round, each averaged over that round's active devices (Algorithm 1, lines 17-22);
  "devices" is ``device_acc``, the mean over the 100 devices of the accuracy of the model each one uses (50 simple,
  50 complex).
* **All-device models** (the paper's reported quantity, its "Reporting Results"): the same aggregation over every
  device's last upload (``eval_all_devices``: ``all_devices/simple`` in evals.csv, ``all_devices_acc``), and the
  device average on them (``all_devices_device_acc``).

Per model: the accuracy at the last evaluation, the mean of the last five evaluations (the curves are noisy with 10
of 100 clients per round), and the rounds to a target (the paper's Tables 1-2 count rounds to a target accuracy; here
the target is 0.9 x the best mean-of-last-five of any method on that model, setting and view; the first evaluated
round at or above it, per seed, "-" when never). Then, per setting and view, whether the paper's ordering on the
simple model (FedHeN >= NoSide >= Decouple) holds on the mean of the last five evaluations, seed by seed. With a second
argument, the curves against rounds (mean over seeds, a band from the lowest to the highest seed; solid: global
models, dashed: all-device models) go to that PNG.
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rayfl.report.decide import verdict
from rayfl.report.runs import RunRecords, load_run

LAST = 5
METHODS = ("fedhen", "noside", "decouple")  # the paper's order
VIEWS = {"global": "Global models (active devices)", "all": "All-device models (the paper's reported quantity)"}
Curve = list[tuple[int, float]]


def _cost(run: RunRecords) -> tuple[float, float, float]:
    """(client updates, training GMACs, simulated seconds) over the whole run."""
    return float(run.rounds["clients_run"].sum()), (run.total_train_macs or 0.0) / 1e9, run.sim_time_s


def _curve(rows: list[dict[str, str]], key: str) -> Curve:
    return [(int(r["round_idx"]) + 1, float(r[key])) for r in rows if r.get(key) not in (None, "", "nan")]


def _read(run_dir: Path) -> dict[str, object]:
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    rounds = list(csv.DictReader((run_dir / "rounds.csv").open()))
    evals = list(csv.DictReader((run_dir / "evals.csv").open()))

    def named(name: str) -> Curve:
        return [(int(r["round_idx"]) + 1, float(r["test_acc"])) for r in evals if r["name"] == name]

    return {
        "setting": cfg.get("setting") or run_dir.parent.name,
        "method": cfg["algorithm"]["name"],
        "seed": int(cfg["seed"]),
        # the run's cost: client updates, training GMACs (one pass of the client's own model per sample), simulated s
        "cost": _cost(load_run(run_dir)),
        ("global", "simple"): named("simple"),
        ("global", "complex"): _curve(rounds, "test_acc"),
        ("global", "devices"): _curve(rounds, "device_acc"),
        ("all", "simple"): named("all_devices/simple"),
        ("all", "complex"): _curve(rounds, "all_devices_acc"),
        ("all", "devices"): _curve(rounds, "all_devices_device_acc"),
    }


def _tail(curve: Curve) -> float:
    tail = [acc for _, acc in curve[-LAST:]]
    return sum(tail) / len(tail) if tail else math.nan


def _stat(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    mean = sum(values) / len(values)
    return f"{mean:.3f}" if len(values) < 2 else f"{mean:.3f} ± {statistics.stdev(values):.3f}"


def _first_reaching(curve: Curve, target: float) -> str:
    return next((str(round_no) for round_no, acc in curve if acc >= target), "-")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def table(runs: list[dict[str, object]], view: str) -> list[str]:
    """One view's table (markdown lines) and its ordering verdicts."""
    header = ["setting", "method", "seeds"]
    for model in ("simple", "complex"):
        header += [f"{model}: last", f"{model}: mean of last {LAST}", f"{model}: rounds to target"]
    header.append("devices: last")
    lines = [f"### {VIEWS[view]}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes, verdicts = [], []
    for setting in sorted({str(r["setting"]) for r in runs}):
        group = [r for r in runs if r["setting"] == setting]
        methods = [m for m in METHODS if any(r["method"] == m for r in group)]
        by_method = {m: sorted((r for r in group if r["method"] == m), key=lambda r: int(r["seed"])) for m in methods}  # type: ignore[call-overload]
        targets = {}
        for model in ("simple", "complex"):
            tails = [_mean([_tail(r[(view, model)]) for r in by_method[m]]) for m in methods]  # type: ignore[index]
            targets[model] = 0.9 * max(tails) if tails else math.nan
        notes.append(f"{setting}: simple {targets['simple']:.3f}, complex {targets['complex']:.3f}")
        for method in methods:
            seeds = by_method[method]
            cells = [setting, method, " ".join(str(r["seed"]) for r in seeds)]
            for model in ("simple", "complex"):
                curves: list[Curve] = [r[(view, model)] for r in seeds]  # type: ignore[misc]
                cells += [
                    _stat([c[-1][1] for c in curves if c]),
                    _stat([_tail(c) for c in curves if c]),
                    ", ".join(_first_reaching(c, targets[model]) for c in curves),
                ]
            cells.append(_stat([r[(view, "devices")][-1][1] for r in seeds if r[(view, "devices")]]))  # type: ignore[index]
            lines.append("| " + " | ".join(cells) + " |")
        verdicts.append(_ordering(setting, by_method, view))
    lines += ["", "Targets (0.9 x the best mean of the last five of any method): " + "; ".join(notes) + ".", ""]
    return lines + verdicts + [""]


def _ordering(setting: str, by_method: dict[str, list[dict[str, object]]], view: str) -> str:
    """Does FedHeN >= NoSide >= Decouple hold on the simple model's mean of the last five, seed by seed?"""
    if not all(m in by_method for m in METHODS):
        return f"- {setting}: not every method ran"
    seeds = sorted({int(r["seed"]) for r in by_method["fedhen"]})  # type: ignore[call-overload]
    parts = []
    for seed in seeds:
        tails = {}
        for m in METHODS:
            run = next((r for r in by_method[m] if r["seed"] == seed), None)
            tails[m] = _tail(run[(view, "simple")]) if run else math.nan  # type: ignore[index]
        first, second = tails["fedhen"] >= tails["noside"], tails["noside"] >= tails["decouple"]
        parts.append(
            f"seed {seed}: FedHeN {tails['fedhen']:.3f} {'>=' if first else '<'} NoSide {tails['noside']:.3f} "
            f"{'>=' if second else '<'} Decouple {tails['decouple']:.3f}"
        )
    return f"- {setting}, simple model, mean of the last {LAST}: " + "; ".join(parts)


DECIDE_LAST = 3  # the project's rule: each run's figure is the mean of its last three evaluations
PAIRS = (("fedhen", "noside"), ("fedhen", "decouple"), ("noside", "decouple"))  # the paper's orderings, A >= B
CHANCE = 0.10


def _figures(group: list[dict[str, object]], seeds: list[int], method: str, view: str, model: str) -> list[float]:
    """``method``'s figure per seed of ``seeds``: the mean of the last ``DECIDE_LAST`` evaluations of that model."""
    chosen = {int(r["seed"]): r for r in group if r["method"] == method}  # type: ignore[call-overload]
    curves: list[Curve] = [chosen[s][(view, model)] for s in seeds]  # type: ignore[misc]
    return [sum(acc for _, acc in c[-DECIDE_LAST:]) / len(c[-DECIDE_LAST:]) for c in curves]


def decisions(runs: list[dict[str, object]]) -> list[str]:
    """Per setting, view and model, each ordering of ``PAIRS`` decided over the seeds every method has (at least
    three), each run's figure the mean of its last ``DECIDE_LAST`` evaluations; and the calibration line (the best
    method's mean against chance)."""
    lines = [
        f"### Decided orderings (mean of the last {DECIDE_LAST} evaluations per run; holds / reversed when the gap "
        "of the means exceeds twice the larger seed range)",
        "",
        "| setting | view | model | ordering | per-seed A | per-seed B | mean A | mean B | gap | 2 x range | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    calibration = []
    for setting in sorted({str(r["setting"]) for r in runs}):
        group = [r for r in runs if r["setting"] == setting]
        seeds = sorted(set.intersection(*({int(r["seed"]) for r in group if r["method"] == m} for m in METHODS)))  # type: ignore[call-overload]
        if len(seeds) < 3:
            lines.append(f"| {setting} | - | - | fewer than three seeds of every method ({seeds}) | | | | | | | |")
            continue
        for view in VIEWS:
            for model in ("simple", "complex"):
                best = max(_mean(_figures(group, seeds, m, view, model)) for m in METHODS)
                calibration.append(
                    f"{setting} {view} {model} (seeds {' '.join(map(str, seeds))}): best {best:.3f}, "
                    f"{100 * (best - CHANCE):+.1f} points"
                )
                for a, b in PAIRS:
                    fa, fb = _figures(group, seeds, a, view, model), _figures(group, seeds, b, view, model)
                    word, gap, bar = verdict(fa, fb)
                    lines.append(
                        f"| {setting} | {view} | {model} | {a} >= {b} | {' '.join(f'{v:.3f}' for v in fa)} | "
                        f"{' '.join(f'{v:.3f}' for v in fb)} | {_mean(fa):.3f} | {_mean(fb):.3f} | {gap:+.3f} | "
                        f"{bar:.3f} | {word} |"
                    )
    return [*lines, "", f"Calibration (chance {CHANCE:.2f}): " + "; ".join(calibration or ["none decided"]) + ".", ""]


def costs(runs: list[dict[str, object]]) -> list[str]:
    """Per setting and method, the mean over its seeds of the run's client updates, training GMACs and simulated
    seconds (the same local work for every method: what differs is the models' size)."""
    lines = [
        "### Cost per run (mean over the seeds)",
        "",
        "The engine counts one pass of the client's own model per sample; FedHeN's side objective on a complex device "
        "adds its side head's pass, which the count leaves out.",
        "",
        "| setting | method | client updates | train GMACs | simulated s |",
        "|---|---|---:|---:|---:|",
    ]
    for setting in sorted({str(r["setting"]) for r in runs}):
        for method in METHODS:
            got = [r["cost"] for r in runs if r["setting"] == setting and r["method"] == method]
            if got:
                mean = [_mean([c[i] for c in got]) for i in range(3)]  # type: ignore[index]
                lines.append(f"| {setting} | {method} | {mean[0]:,.0f} | {mean[1]:,.1f} | {mean[2]:.2f} |")
    return [*lines, ""]


def main(root: Path) -> list[dict[str, object]]:
    runs = [_read(p.parent) for p in sorted(root.rglob("evals.csv"))]
    for view in VIEWS:
        print("\n".join(table(runs, view)))
    print("\n".join(decisions(runs)))
    print("\n".join(costs(runs)))
    return runs


def _band(curves: list[Curve]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Rounds every seed evaluated, with the mean, lowest and highest accuracy over seeds at each."""
    common = sorted(set.intersection(*(set(dict(c)) for c in curves))) if curves else []
    values = [[dict(c)[x] for c in curves] for x in common]
    return common, [_mean(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def plot(runs: list[dict[str, object]], path: Path) -> None:
    """Accuracy against rounds: one row per setting, columns simple, complex and the device average; one colour per
    method, solid for the global models and dashed for the all-device models, mean over seeds with a min-max band."""
    settings = sorted({str(r["setting"]) for r in runs})
    fig = Figure(figsize=(15, 4.0 * len(settings)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(settings), 3, squeeze=False)
    colours = {"fedhen": "tab:blue", "noside": "tab:orange", "decouple": "tab:green"}
    for i, setting in enumerate(settings):
        for j, model in enumerate(("simple", "complex", "devices")):
            ax = axes[i][j]
            for method in METHODS:
                group = [r for r in runs if r["setting"] == setting and r["method"] == method]
                for view, style in (("global", "-"), ("all", "--")):
                    curves: list[Curve] = [r[(view, model)] for r in group if r[(view, model)]]  # type: ignore[misc]
                    if not curves:
                        continue
                    x, mean, low, high = _band(curves)
                    label = f"{method} ({'global' if view == 'global' else 'all devices'})"
                    ax.plot(x, mean, style, color=colours[method], label=label, linewidth=1.2)
                    if len(curves) > 1:
                        ax.fill_between(x, low, high, color=colours[method], alpha=0.12 if view == "global" else 0.06)
            seeds = len({r["seed"] for r in runs if r["setting"] == setting})
            title = "device average" if model == "devices" else f"{model} model"
            ax.set_title(f"{setting}: {title} ({seeds} seeds)")
            ax.set_xlabel("Round")
            ax.set_ylabel("Test accuracy")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    found = main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fedhen"))
    if len(sys.argv) > 2:
        plot(found, Path(sys.argv[2]))
