"""Round policies compared on paper 000's CPU setting 6 (char-BERT on Shakespeare, 100 clients, bandwidth replayed
from the Mahimahi cellular logs): sync, over-commitment (o = 0.3), FedBuff (C = 10 in flight, B = 5) and FedAsync
(C = 10, B = 1), each with FedAvg on the smallest model and HeteroFL, for two seeds (issue 27).

Every run sees the same number of client updates (300): sync and over-commit 30 rounds of 10, FedBuff 60 steps of 5,
FedAsync 300 steps of 1; the comparison is accuracy at fixed simulated times (the last evaluation at or before each
time), since the policies differ in how much simulated time those updates take.

    python experiments/policies/compare.py            # runs what is missing, then writes the table and plot
    python experiments/policies/compare.py --table    # the table and plot from the committed records only

Runs go to ``runs/policies/``; each run's records (``rounds.csv``, ``evals.csv``, ``config.yaml``, ``summary.json``)
are copied to ``experiments/policies/results/<run>/`` so that the table regenerates without re-running.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
SETTING = ROOT / "experiments" / "paper" / "cpu" / "setting6.yaml"
RESULTS = Path(__file__).resolve().parent / "results"
RUNS = ROOT / "runs" / "policies"
SEEDS = (0, 1)
METHODS = {
    "smallest": ["algorithm.name=fedavg", "algorithm.model=smallest", "algorithm.ratios=[0,0.5,1]"],
    "heterofl": ["algorithm.name=heterofl"],
}
POLICIES = {  # overrides; 300 client updates each
    "sync": ["rounds=30", "eval_every=2"],
    "overcommit": ["server.policy=overcommit", "server.overcommit=0.3", "rounds=30", "eval_every=2"],
    "fedbuff": ["server.policy=fedbuff", "server.concurrency=10", "server.buffer_size=5", "rounds=60", "eval_every=4"],
    "fedasync": ["server.policy=fedasync", "server.concurrency=10", "rounds=300", "eval_every=20"],
}
KEEP = ("rounds.csv", "evals.csv", "config.yaml", "summary.json")


def run_name(policy: str, method: str, seed: int) -> str:
    return f"{policy}-{method}-s{seed}"


def run_missing() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for seed in SEEDS:
        for method, method_args in METHODS.items():
            for policy, policy_args in POLICIES.items():
                name = run_name(policy, method, seed)
                if (RESULTS / name / "summary.json").exists():
                    continue
                shutil.rmtree(RUNS / name, ignore_errors=True)
                args = [f"name={name}", f"seed={seed}", f"output_dir={RUNS}", *method_args, *policy_args]
                print("rayfl run", SETTING.relative_to(ROOT), *args, flush=True)
                subprocess.run([sys.executable, "-m", "rayfl.cli", "run", str(SETTING), *args], check=True, env=env)
                (RESULTS / name).mkdir(parents=True, exist_ok=True)
                for file in KEEP:
                    if (RUNS / name / file).exists():
                        shutil.copy2(RUNS / name / file, RESULTS / name / file)


def accuracy_at(rounds: pd.DataFrame, hours: float) -> float:
    """The last evaluated accuracy at or before ``hours`` of simulated time (NaN before the first evaluation)."""
    done = rounds[(rounds["sim_time_s"] <= hours * 3600.0) & rounds["test_acc"].notna()]
    return float(done["test_acc"].iloc[-1]) if len(done) else float("nan")


def table() -> str:
    found = sorted(d for d in RESULTS.iterdir() if (d / "rounds.csv").exists()) if RESULTS.exists() else []
    frames = {d.name: pd.read_csv(d / "rounds.csv") for d in found}
    if not frames:
        return "no records under experiments/policies/results/: run this script without --table first"
    lines = [
        "| method | policy | acc @ T/4 | acc @ T/2 | acc @ T | sim hours for 300 updates | mean staleness | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        # T: the method's shorter sync run's simulated time for its 300 updates
        ends = [f["sim_time_s"].iloc[-1] for n, f in frames.items() if n.startswith(f"sync-{method}-")]
        if not ends:
            continue
        end_h = min(ends) / 3600.0
        for policy in POLICIES:
            runs = [frames.get(run_name(policy, method, s)) for s in SEEDS]
            runs = [r for r in runs if r is not None]
            if not runs:
                continue
            cells = []
            for q in (0.25, 0.5, 1.0):
                accs = [accuracy_at(r, q * end_h) for r in runs]
                cells.append(" / ".join(f"{100 * a:.1f}" for a in accs))
            hours = " / ".join(f"{r['sim_time_s'].iloc[-1] / 3600:.2f}" for r in runs)
            stale = " / ".join(f"{r['staleness_mean'].mean():.2f}" for r in runs)
            failed = " / ".join(str(int(r["clients_failed"].sum())) for r in runs)
            lines.append(
                f"| {method} (T = {end_h:.3f} h) | {policy} | "
                + " | ".join(cells)
                + f" | {hours} | {stale} | {failed} |"
            )
    seeds = " / ".join(map(str, SEEDS))
    note = "accuracy in %, the last evaluation at or before each simulated time; T: the method's shorter sync run's end"
    return "\n".join(lines) + f"\n\n(seeds {seeds}; {note})\n"


def plot() -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METHODS), figsize=(6 * len(METHODS), 4), sharey=True)
    for ax, method in zip(axes, METHODS, strict=True):
        for policy in POLICIES:
            for seed in SEEDS:
                path = RESULTS / run_name(policy, method, seed) / "rounds.csv"
                if not path.exists():
                    continue
                r = pd.read_csv(path)
                r = r[r["test_acc"].notna()]
                ax.plot(
                    r["sim_time_s"] / 3600,
                    100 * r["test_acc"],
                    label=f"{policy} s{seed}",
                    linestyle="-" if seed == 0 else "--",
                )
        ax.set_title(f"{method} (setting 6, CPU)")
        ax.set_xlabel("simulated hours")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    axes[-1].legend(fontsize=7)
    out = Path(__file__).resolve().parent / "accuracy_vs_sim_hours.png"
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", action="store_true", help="only the table and plot, from the committed records")
    args = parser.parse_args()
    if not args.table:
        run_missing()
    text = table()
    print(text)
    (Path(__file__).resolve().parent / "table.md").write_text(text)
    print("plot:", plot())


if __name__ == "__main__":
    main()
