"""FedResCuE vs FedSlim vs FjORD vs HeteroFL, and paper 004's ablations FedSeq and FedRush, under unstable links
(paper 004, Sec. 5.4 and 5.6), CPU-sized.

Runs experiments/fedrescue/cpu.yaml once per method, error rate (er per column, constant; 0 = links that never lose a
column) and seed, one run after another, seed by seed (so that an interrupted sweep leaves whole seeds). The engine
evaluates the global model's x0.25 ... x1 sub-models (first-k, batch statistics) every evaluated round
(``eval_widths``, evals.csv). Every run's figures go to a JSON file as soon as it finishes (``--runs``; a run already
there is not run again), and from it the script writes the table (``--out``), each width's accuracy against rounds
(``--curves``) and the mean accuracy over widths against the MB moved (``--bytes-plot``). Every method pads locally
(Eq. 5), as in the paper.

    python experiments/fedrescue/run_table.py [--rounds N] [--seeds 0 1 2] [--methods FedResCuE ...]
        [--runs runs.json] [--out results.md] [--curves curves.png] [--bytes-plot bytes.png]

With several seeds every number is the mean over them (accuracy also with its spread, max - min).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from rayfl.config import (
    FedResCuEConfig,
    FedRushConfig,
    FedSeqConfig,
    FedSlimConfig,
    FjORDConfig,
    HeteroFLConfig,
    ResourceConfig,
)
from rayfl.config_loader import load_config
from rayfl.engine.driver import run_experiment

HERE = Path(__file__).parent
CAPACITIES = (0.25, 0.5, 0.75, 1.0)
ERROR_RATES = (0.0, 0.1, 0.2)
WIDTHS = [f"x{p:g}" for p in CAPACITIES]


def methods(base: FedResCuEConfig) -> dict[str, Any]:
    nested = {"capacities": base.capacities, "ratios": base.ratios, "num_ratios": base.num_ratios}
    return {
        "FedResCuE": base,
        "FedSlim": FedSlimConfig(**nested),
        "FjORD": FjORDConfig(widths=CAPACITIES, kd=True),
        "HeteroFL": HeteroFLConfig(rates=tuple(reversed(CAPACITIES)), label_mask=False, static_bn=False),
        "FedSeq": FedSeqConfig(**nested),
        "FedRush": FedRushConfig(**nested, alpha=base.alpha),
    }


def run_key(label: str, er: float, seed: int) -> str:
    return f"{label}/er{er:g}/seed{seed}"


def summarise(result: Any, wall_s: float) -> dict[str, Any]:
    """What the table and plots need of one run: each width's accuracy per evaluated round (1-based) with the MB
    moved (down + up) up to that round, final accuracies, MB down and up, uploads lost, wall seconds."""
    moved = np.cumsum([(r.bytes_down + r.bytes_up) / 1e6 for r in result.records])
    curves = {w: [[e.round_idx + 1, e.test_acc] for e in result.evals if e.name == w] for w in WIDTHS}
    rounds = [r for r, _ in curves[WIDTHS[-1]]]
    return {
        "final": [curves[w][-1][1] for w in WIDTHS],
        "curves": curves,
        "mb_moved": [float(moved[r - 1]) for r in rounds],
        "mb_down": sum(r.bytes_down for r in result.records) / 1e6,
        "mb_up": sum(r.bytes_up for r in result.records) / 1e6,
        "uploads_lost": sum(r.clients_failed for r in result.records),
        "wall_s": wall_s,
    }


def table(runs: dict[str, Any], labels: list[str], seeds: list[int], rounds: int, command: str) -> str:
    lines = [
        f"# FedResCuE vs baselines under unstable links ({rounds} rounds, `{HERE.name}/cpu.yaml`, "
        f"seeds {', '.join(map(str, seeds))})",
        "",
        "Produced by",
        "",
        f"    {command}",
        "",
        "Accuracy of the final global model's x p sub-models on the 1000 test images (the engine's last `eval_widths`",
        "evaluation), mean over seeds with the spread (max - min) in brackets; `mean` is the mean over the four",
        "widths (its spread over seeds in brackets); MB moved over the run (down, up, as sent: delivered columns plus",
        "the lost one); client-rounds whose whole upload was lost; wall seconds per run on a shared 2-core machine",
        "under other jobs' load (not a timing figure).",
        "",
        "| method | er | x0.25 | x0.5 | x0.75 | x1 | mean | MB down | MB up | uploads lost | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    means: dict[tuple[str, float], np.ndarray] = {}
    for er in ERROR_RATES:
        for label in labels:
            got = [runs[k] for s in seeds if (k := run_key(label, er, s)) in runs]
            if not got:
                continue
            acc = np.asarray([g["final"] for g in got])
            per_seed = acc.mean(axis=1)
            means[(label, er)] = per_seed
            cells = " | ".join(f"{m:.3f} ({s:.3f})" for m, s in zip(acc.mean(axis=0), np.ptp(acc, axis=0), strict=True))
            lines.append(
                f"| {label} | {er:g} | {cells} | {per_seed.mean():.3f} ({np.ptp(per_seed):.3f}) | "
                f"{np.mean([g['mb_down'] for g in got]):.2f} | {np.mean([g['mb_up'] for g in got]):.2f} | "
                f"{np.mean([g['uploads_lost'] for g in got]):.1f} | {np.mean([g['wall_s'] for g in got]):.0f} |"
            )
    lines += [
        "",
        "Mean accuracy over the four widths, change from er = 0 to er = 0.1 and 0.2 (per seed, then mean and range):",
        "",
    ]
    for label in labels:
        if not all((label, er) in means for er in ERROR_RATES):
            continue
        base = means[(label, 0.0)]
        parts = []
        for er in ERROR_RATES[1:]:
            drop = means[(label, er)] - base if len(means[(label, er)]) == len(base) else np.array([np.nan])
            parts.append(f"er {er:g}: {drop.mean():+.3f} [{drop.min():+.3f}, {drop.max():+.3f}]")
        lines.append(f"- {label}: {base.mean():.3f} at er 0; " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def _mean_curve(got: list[dict[str, Any]], width: str) -> tuple[list[int], np.ndarray]:
    rounds = [r for r, _ in got[0]["curves"][width]]
    return rounds, np.mean([[a for _, a in g["curves"][width]] for g in got], axis=0)


def plot_curves(runs: dict[str, Any], labels: list[str], seeds: list[int], path: Path) -> None:
    """One panel per error rate and width, one line per method: accuracy against rounds, mean over seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2 * len(WIDTHS), 2.8 * len(ERROR_RATES)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(ERROR_RATES), len(WIDTHS), squeeze=False)
    for i, er in enumerate(ERROR_RATES):
        for j, width in enumerate(WIDTHS):
            ax = axes[i][j]
            for label in labels:
                got = [runs[k] for s in seeds if (k := run_key(label, er, s)) in runs]
                if got:
                    rounds, acc = _mean_curve(got, width)
                    ax.plot(rounds, acc, label=label)
            ax.set_title(f"er {er:g}, {width}", fontsize=9)
            ax.set_xlabel("Round")
            ax.set_ylabel("Test accuracy")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Accuracy of each x p sub-model against rounds (mean over seeds {', '.join(map(str, seeds))})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_bytes(runs: dict[str, Any], labels: list[str], seeds: list[int], path: Path) -> None:
    """One panel per error rate: mean accuracy over the widths against MB moved (down + up), mean over seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(ERROR_RATES), 3.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(ERROR_RATES), squeeze=False)[0]
    for ax, er in zip(axes, ERROR_RATES, strict=True):
        for label in labels:
            got = [runs[k] for s in seeds if (k := run_key(label, er, s)) in runs]
            if not got:
                continue
            acc = np.mean([_mean_curve(got, w)[1] for w in WIDTHS], axis=0)
            moved = np.mean([g["mb_moved"] for g in got], axis=0)
            ax.plot(moved, acc, label=label)
        ax.set_title(f"er {er:g}", fontsize=9)
        ax.set_xlabel("MB moved (down + up)")
        ax.set_ylabel("Mean accuracy over x0.25 ... x1")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=0, help="override the YAML's rounds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", default=[], help="labels to run (default: all six)")
    parser.add_argument("--runs", default=str(HERE / "runs.json"), help="every finished run's figures (JSON)")
    parser.add_argument("--out", default=str(HERE / "results.md"))
    parser.add_argument("--curves", default="", help="write each width's accuracy against rounds to this PNG")
    parser.add_argument("--bytes-plot", default="", help="write mean accuracy against MB moved to this PNG")
    parser.add_argument("--output-dir", default="", help="where the runs go (default: the YAML's output_dir)")
    parser.add_argument("--command", default="", help="the command line to state in the table")
    args = parser.parse_args()
    base = dataclasses.replace(load_config(HERE / "cpu.yaml"), eval_widths=CAPACITIES)
    if args.rounds:
        base = dataclasses.replace(base, rounds=args.rounds)
    if args.output_dir:
        base = dataclasses.replace(base, output_dir=args.output_dir)
    assert isinstance(base.algorithm, FedResCuEConfig)
    catalogue = methods(base.algorithm)
    labels = args.methods or list(catalogue)
    path = Path(args.runs)
    runs: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for seed in args.seeds:
        for er in ERROR_RATES:
            links = dataclasses.replace(base.system.links, error_rate=ResourceConfig(source="constant", low=er))
            for label in labels:
                key = run_key(label, er, seed)
                if key in runs and runs[key].get("rounds") == base.rounds:
                    continue
                cfg = dataclasses.replace(
                    base,
                    name=f"{label.lower()}-er{er:g}-seed{seed}",
                    seed=seed,
                    algorithm=catalogue[label],
                    system=dataclasses.replace(base.system, links=links),
                )
                began = time.perf_counter()
                result = run_experiment(cfg)
                runs[key] = {"rounds": base.rounds, **summarise(result, time.perf_counter() - began)}
                path.write_text(json.dumps(runs, indent=1) + "\n")
                print(f"{key}: acc x.25/.5/.75/1 = {runs[key]['final']}", flush=True)
    done = {k: v for k, v in runs.items() if v.get("rounds") == base.rounds}
    command = args.command or "python experiments/fedrescue/run_table.py " + " ".join(
        f"--seeds {' '.join(map(str, args.seeds))}".split()
    )
    Path(args.out).write_text(table(done, labels, args.seeds, base.rounds, command))
    print(f"wrote {args.out}")
    if args.curves:
        plot_curves(done, labels, args.seeds, Path(args.curves))
        print(f"wrote {args.curves}")
    if args.bytes_plot:
        plot_bytes(done, labels, args.seeds, Path(args.bytes_plot))
        print(f"wrote {args.bytes_plot}")


if __name__ == "__main__":
    main()
