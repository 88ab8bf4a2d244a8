"""Paper 002's orderings decided over three seeds, every method under the same clipping (issue 42).

    PYTHONPATH=$PWD python experiments/fedtrans/decided.py > experiments/fedtrans/decided.md

Reads the committed records of two runs of ``run_table.py`` on ``cifar_mobilenet.yaml`` (100 rounds, seeds 0-2,
every method with today's code), which differ only in gradient clipping:

* ``records/decided_noclip``: no method clips (HeteroFL's authors' clip at norm 1 turned off with
  ``--heterofl-clip 0``; every other method already trains without a clip), the table;
* ``records/decided_clip1``: every method clips each local step at norm 1 (``--set train.grad_clip_norm=1``; HeteroFL's
  own clip is 1 by default), the ablation with the other choice.

Each run's figure is the mean of its last three evaluations of the average client accuracy (rounds 80, 90, 100);
an ordering holds or is reversed only when the gap between the 3-seed means exceeds twice the larger seed range
(``rayfl.report.decide``). Beside accuracy: client updates (clients that trained, over the run), training MACs
(3 x forward x samples), bytes moved and simulated seconds, each the mean over the seeds; chance is the most frequent
test label's share (``summary.json``'s ``baseline_acc``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pandas as pd

from rayfl.report.decide import spread, tail_mean, verdict
from rayfl.report.runs import RunRecords, load_run

HERE = Path(__file__).resolve().parent
METHODS = {
    "fedtrans": "FedTrans",
    "heterofl": "HeteroFL (largest model)",
    "splitmix": "SplitMix (largest model, 8 bases)",
    "fluid": "FLuID (largest model)",
    "fedavg": "FedAvg (initial model)",
}
BASELINES = ("heterofl", "splitmix", "fluid", "fedavg")
PAPER_ORDERINGS = ("heterofl", "splitmix", "fluid")  # paper 002: FedTrans above each, at lower cost
TABLES = {
    "decided_noclip": "No method clips gradients (the table)",
    "decided_clip1": "Every method clips each local step at gradient norm 1 (ablation: the other choice)",
}


def figure(run: RunRecords) -> float:
    """The run's accuracy figure (%): the mean of its last three evaluations of the average client accuracy."""
    acc = pd.to_numeric(run.rounds["client_acc"], errors="coerce").dropna().tolist()
    return 100.0 * tail_mean(acc)


def costs(run: RunRecords) -> dict[str, float]:
    rounds = run.rounds
    return {
        "updates": float(pd.to_numeric(rounds["clients_run"]).sum()),
        "gmacs": (run.total_train_macs or 0.0) / 1e9,
        "mb": (run.total_bytes or 0) / 1e6,
        "sim_s": run.sim_time_s,
        "wall_min": (run.wall_time_s or 0.0) / 60.0,
        "chance": 100.0 * (run.baseline_acc or float("nan")),
    }


def load(records: Path) -> dict[str, dict[int, RunRecords]]:
    runs: dict[str, dict[int, RunRecords]] = {m: {} for m in METHODS}
    for seed_dir in sorted(records.glob("seed*")):
        seed = int(seed_dir.name.removeprefix("seed"))
        for method in METHODS:
            if (seed_dir / method / "summary.json").is_file():
                runs[method][seed] = load_run(seed_dir / method)
    return runs


def section(name: str, title: str) -> list[str]:
    runs = load(HERE / "records" / name)
    seeds = sorted(set.intersection(*(set(by_seed) for by_seed in runs.values())))
    out = [f"## {title}", "", f"Records: `experiments/fedtrans/records/{name}/seed<S>/<method>/`; seeds {seeds}.", ""]
    if len(seeds) < 3:
        return [*out, f"Fewer than three seeds of every method ({seeds}): nothing decided.", ""]
    figures = {m: [figure(runs[m][s]) for s in seeds] for m in METHODS}
    cost = {m: [costs(runs[m][s]) for s in seeds] for m in METHODS}

    def mean(method: str, key: str) -> float:
        return statistics.fmean(c[key] for c in cost[method])

    chance = statistics.fmean(c["chance"] for m in METHODS for c in cost[m])
    best = max(BASELINES, key=lambda m: spread(figures[m])[0])
    minutes = [c["wall_min"] for m in METHODS for c in cost[m]]
    out += [
        f"**Calibration:** strongest baseline {METHODS[best]} {spread(figures[best])[0]:.2f} % against chance "
        f"{chance:.2f} %: **{spread(figures[best])[0] - chance:+.1f} points** (the bar: +25); runs took "
        f"{min(minutes):.1f}-{max(minutes):.1f} min each (up to six jobs sharing 2 cores: not a timing figure).",
        "",
        "| Method | per seed (%) | mean (%) | range | client updates | train GMACs | network MB | simulated s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for method, label in METHODS.items():
        mean_acc, rng = spread(figures[method])
        out.append(
            f"| {label} | {' / '.join(f'{v:.2f}' for v in figures[method])} | {mean_acc:.2f} | {rng:.2f} | "
            f"{mean(method, 'updates'):.0f} | {mean(method, 'gmacs'):.1f} | {mean(method, 'mb'):.1f} | "
            f"{mean(method, 'sim_s'):.1f} |"
        )
    out += [
        "",
        "| Ordering | gap (points) | 2 x larger range | accuracy | FedTrans's MACs / B's, per seed | paper's |",
        "|---|---:|---:|---|---|---|",
    ]
    for other in BASELINES:
        word, gap, bar = verdict(figures["fedtrans"], figures[other])
        ratio = [a["gmacs"] / b["gmacs"] for a, b in zip(cost["fedtrans"], cost[other], strict=True)]
        cheaper = "lower in every seed" if all(r < 1 for r in ratio) else "not lower in every seed"
        out.append(
            f"| FedTrans above {METHODS[other]} | {gap:+.2f} | {bar:.2f} | **{word}** | "
            f"{' / '.join(f'{r:.2f}x' for r in ratio)} ({cheaper}) | {'yes' if other in PAPER_ORDERINGS else 'no'} |"
        )
    return [*out, ""]


def main() -> None:
    lines = [
        "# Paper 002 (FedTrans) decided over three seeds, equal clipping (issue 42)",
        "",
        "`PYTHONPATH=$PWD python experiments/fedtrans/decided.py > experiments/fedtrans/decided.md`; the runs: see "
        '`README.md` ("Decided over three seeds").',
        "",
        "Setting `cifar_mobilenet.yaml` (100 clients, Dirichlet 0.5 label skew over synthetic CIFAR-like images, 10 "
        "clients a round, 5 local steps of batch 10, SGD lr 0.05 momentum 0.9, 100 rounds, evaluation every 10). "
        "Figure per run: mean of the last three evaluations of the average client accuracy; verdicts by the "
        "project's rule (gap of 3-seed means over twice the larger seed range).",
        "",
    ]
    for name, title in TABLES.items():
        lines += section(name, title)
    sys.stdout.write("\n".join(lines))


if __name__ == "__main__":
    main()
