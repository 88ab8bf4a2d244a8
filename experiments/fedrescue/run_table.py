"""FedResCuE vs FedSlim vs FjORD vs HeteroFL under unstable links (paper 004, Sec. 5.4), CPU-sized.

Runs experiments/fedrescue/cpu.yaml once per method and error rate (er per column, constant; 0 = links that never
lose a column). The engine evaluates the global model's x0.25 ... x1 sub-models (first-k, batch statistics) every
evaluated round (``eval_widths``, evals.csv); the table holds the last evaluation's and writes
experiments/fedrescue/results.md, with ``--curves`` each width's accuracy against rounds as a PNG. Every method pads
locally (Eq. 5), as in the paper.

    python experiments/fedrescue/run_table.py [--rounds N] [--seeds 0 1] [--out results.md] [--curves curves.png]

With several seeds every number is the mean over them (accuracy also with its spread, max - min).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from rayfl.config import (
    FedResCuEConfig,
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


def methods(base: FedResCuEConfig) -> dict[str, Any]:
    return {
        "FedResCuE": base,
        "FedSlim": FedSlimConfig(capacities=base.capacities, ratios=base.ratios, num_ratios=base.num_ratios),
        "FjORD": FjORDConfig(widths=CAPACITIES, kd=True),
        "HeteroFL": HeteroFLConfig(rates=tuple(reversed(CAPACITIES)), label_mask=False, static_bn=False),
    }


def width_curves(evals: list[Any]) -> dict[float, list[tuple[int, float]]]:
    """Each width's accuracy against rounds (1-based) from a run's ``eval_widths`` records."""
    return {p: [(e.round_idx + 1, e.test_acc) for e in evals if e.name == f"x{p:g}"] for p in CAPACITIES}


def plot(curves: dict[tuple[str, float], list[dict[float, list[tuple[int, float]]]]], path: Path) -> None:
    """One panel per error rate and width, one line per method (the first seed's curve)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2 * len(CAPACITIES), 2.8 * len(ERROR_RATES)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(ERROR_RATES), len(CAPACITIES), squeeze=False)
    for i, er in enumerate(ERROR_RATES):
        for j, p in enumerate(CAPACITIES):
            ax = axes[i][j]
            for (label, e), runs in curves.items():
                if e == er:
                    ax.plot([c[0] for c in runs[0][p]], [c[1] for c in runs[0][p]], label=label)
            ax.set_title(f"er {er:g}, x{p:g}", fontsize=9)
            ax.set_xlabel("Round")
            ax.set_ylabel("Test accuracy")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=0, help="override the YAML's rounds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default=str(HERE / "results.md"))
    parser.add_argument("--curves", default="", help="write each width's accuracy against rounds to this PNG")
    parser.add_argument("--output-dir", default="", help="where the runs go (default: the YAML's output_dir)")
    args = parser.parse_args()
    base = dataclasses.replace(load_config(HERE / "cpu.yaml"), eval_widths=CAPACITIES)
    if args.rounds:
        base = dataclasses.replace(base, rounds=args.rounds)
    if args.output_dir:
        base = dataclasses.replace(base, output_dir=args.output_dir)
    curves: dict[tuple[str, float], list[dict[float, list[tuple[int, float]]]]] = {}
    assert isinstance(base.algorithm, FedResCuEConfig)
    rows = []
    for er in ERROR_RATES:
        links = dataclasses.replace(base.system.links, error_rate=ResourceConfig(source="constant", low=er))
        for label, algorithm in methods(base.algorithm).items():
            accs, downs, ups, lost, began = [], [], [], [], time.perf_counter()
            for seed in args.seeds:
                cfg = dataclasses.replace(
                    base,
                    name=f"{label.lower()}-er{er:g}-seed{seed}",
                    seed=seed,
                    algorithm=algorithm,
                    system=dataclasses.replace(base.system, links=links),
                )
                result = run_experiment(cfg)
                by_width = width_curves(result.evals)
                curves.setdefault((label, er), []).append(by_width)
                accs.append([by_width[p][-1][1] for p in CAPACITIES])
                downs.append(sum(r.bytes_down for r in result.records) / 1e6)
                ups.append(sum(r.bytes_up for r in result.records) / 1e6)
                lost.append(sum(r.clients_failed for r in result.records))
                print(f"{label:10s} er={er:.1f} seed={seed} acc x.25/.5/.75/1 = {accs[-1]}", flush=True)
            acc = np.asarray(accs)
            rows.append(
                (
                    label,
                    er,
                    acc,
                    float(np.mean(downs)),
                    float(np.mean(ups)),
                    float(np.mean(lost)),
                    (time.perf_counter() - began) / len(args.seeds),
                )
            )
    lines = [
        f"# FedResCuE vs baselines under unstable links ({base.rounds} rounds, `{HERE.name}/cpu.yaml`, "
        f"seeds {', '.join(map(str, args.seeds))})",
        "",
        "Accuracy of the final global model's x p sub-models on the 1000 test images (the engine's last `eval_widths`",
        "evaluation; mean over seeds, with several",
        "seeds the spread max - min in brackets); MB moved over the run (down, up, as sent: delivered columns plus",
        "the lost one); clients whose whole upload was lost; wall seconds per run, measured on a shared 2-core",
        "machine under other jobs' load.",
        "",
        "| method | er | x0.25 | x0.5 | x0.75 | x1 | mean | MB down | MB up | uploads lost | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, er, acc, down, up, failed, wall in rows:
        mean, spread = acc.mean(axis=0), acc.max(axis=0) - acc.min(axis=0)
        cells = " | ".join(
            f"{m:.3f} ({s:.3f})" if len(acc) > 1 else f"{m:.3f}" for m, s in zip(mean, spread, strict=True)
        )
        lines.append(
            f"| {label} | {er:g} | {cells} | {acc.mean():.3f} | {down:.2f} | {up:.2f} | {failed:.1f} | {wall:.0f} |"
        )
    lines += ["", "Mean accuracy over the four widths, drop from er = 0 to er = 0.2:", ""]
    for label in methods(base.algorithm):
        mean = {er: float(acc.mean()) for lab, er, acc, *_ in rows if lab == label}
        lines.append(f"- {label}: {mean[0.0]:.3f} -> {mean[0.2]:.3f} ({mean[0.2] - mean[0.0]:+.3f})")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    if args.curves:
        plot(curves, Path(args.curves))
        print(f"wrote {args.curves}")


if __name__ == "__main__":
    main()
