"""Issue 24's ablation: does the round cap or the method explain "FedAvg on the initial model beats FedTrans"?

    PYTHONPATH=$PWD python experiments/fedtrans/ablate_cap.py [--seed 0] [--long 300] [--early 15 30 45]
        [--records experiments/fedtrans/records/cifar_like_ablation] [--out experiments/fedtrans/issue24]
    PYTHONPATH=$PWD python experiments/fedtrans/ablate_cap.py \
        --from-records experiments/fedtrans/records/cifar_like_ablation

On the CIFAR-like setting (``cpu.yaml``, the 3-conv start of ``issue24/results.md``), one seed:

* **cap**: FedTrans and FedAvg with a round cap ``--long`` times longer than the table's 100 rounds; if the cap
  explains the gap, FedTrans's grown models catch up given rounds and the gap closes;
* **early**: FedTrans at the table's 100 rounds with its transformations forced after rounds ``--early``
  (``algorithm.force_rounds``; the degree of convergence may still fire others), so the grown models have most of the
  run to train instead of 2-32 rounds.

The table's own 100-round FedTrans and FedAvg runs of that seed are read from ``records/cifar_like/seed<S>/``.
Writes ``ablation_cap.md`` to ``--out``: per run the final average client accuracy, the mean of the last three
evaluations, the models and their accuracies, each model's client-rounds (its share of the run's training), where
the clients are scored at the end, training MACs, and FedTrans's transformations (round, DoC or forced, steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_table import ablation_args, run_plans

from rayfl.report import load_run
from rayfl.report.runs import RunRecords

HERE = Path(__file__).resolve().parent
TABLE = HERE / "records" / "cifar_like"


def _rounds(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "rounds.csv", dtype=str, keep_default_na=False)


def _client_rounds(run_dir: Path) -> list[int]:
    """Client-rounds per model over the run (``clients_per_model``; a round with one model: ``clients_run``)."""
    rows = _rounds(run_dir)
    per: list[int] = []
    for text, ran in zip(rows["clients_per_model"], rows["clients_run"], strict=True):
        counts = [int(v) for v in text.split()] or [int(float(ran))]
        width = max(len(per), len(counts))
        per = [a + b for a, b in zip(per + [0] * (width - len(per)), counts + [0] * (width - len(counts)), strict=True)]
    return per


def _model_accs(run_dir: Path) -> str:
    """The last evaluation's per-model test accuracies (``-`` for one model)."""
    evaluated = [t for t in _rounds(run_dir)["model_accs"] if t.strip()]
    return " / ".join(f"{100 * float(v):.1f}" for v in evaluated[-1].split()) if evaluated else "-"


def _last3(run: RunRecords) -> float:
    acc = pd.to_numeric(run.rounds["client_acc"]).dropna()
    return 100.0 * statistics.fmean(acc.iloc[-3:])


def _ended_on(run_dir: Path, models: int) -> str:
    """How many clients are scored on each model at the last evaluation (their compatible model of highest utility)."""
    rows = pd.read_csv(run_dir / "client_accs.csv")
    counts = rows[rows["round_idx"] == rows["round_idx"].max()]["model_id"].astype(int).value_counts()
    return " / ".join(str(int(counts.get(k, 0))) for k in range(max(models, int(counts.index.max()) + 1)))


def table(dirs: dict[str, Path]) -> str:
    lines = [
        "| Run | Rounds | Client acc (%) | Last-3 mean (%) | Models | Model accs (%) | Client-rounds per model | "
        "Clients scored on each model at the end | Train GMACs |",
        "|---|---:|---:|---:|---:|---|---|---|---:|",
    ]
    for label, run_dir in dirs.items():
        run = load_run(run_dir)
        lines.append(
            f"| {label} | {run.rounds_run} | {100 * (run.final_client_acc or float('nan')):.2f} | {_last3(run):.2f} | "
            f"{run.num_models or 1} | {_model_accs(run_dir)} | {' / '.join(map(str, _client_rounds(run_dir)))} | "
            f"{_ended_on(run_dir, run.num_models or 1)} | "
            f"{(run.total_train_macs or 0) / 1e9:.0f} |"
        )
    return "\n".join(lines) + "\n"


def transformations(dirs: dict[str, Path]) -> list[str]:
    out: list[str] = []
    for label, run_dir in dirs.items():
        summary = json.loads((run_dir / "summary.json").read_text()).get("fedtrans")
        if not summary:
            continue
        flops = summary["train_flops_per_sample"]
        out.append(
            f"- {label}: "
            + "; ".join(
                f"after round {t['round_idx']} model {t['child']} ("
                + ("forced" if t["forced"] or t["doc"] is None else f"DoC {t['doc']:.5f}")
                + f", {', '.join(t['steps'])}, {flops[t['child']] / flops[0]:.1f}x FLOPs)"
                for t in summary["transformations"]
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--long", type=int, default=300)
    parser.add_argument("--early", type=int, nargs="+", default=[15, 30, 45])
    args = ablation_args(parser, "runs/i24-ablation", "cifar_like_ablation")
    seed = args.seed
    names = {
        "fedtrans-cap": f"FedTrans, {args.long} rounds",
        "fedavg-cap": f"FedAvg (initial model), {args.long} rounds",
        "fedtrans-early": f"FedTrans, 100 rounds, forced after {', '.join(map(str, args.early))}",
    }
    if args.from_records is not None:
        got = {m: args.from_records / f"seed{seed}" / m for m in names}
    else:
        out, config = args.runs / f"seed{seed}", HERE / "cpu.yaml"
        long = [f"seed={seed}", f"rounds={args.long}"]
        plans = {  # the cheapest first; each run's records are copied as soon as it ends
            "fedtrans-early": [f"seed={seed}", "rounds=100", f"algorithm.force_rounds={args.early}"],
            "fedtrans-cap": long,
            "fedavg-cap": [*long, "algorithm.name=fedavg"],
        }
        got = run_plans(config, plans, out, seed, args.records)
    dirs = {
        "FedTrans, 100 rounds (the table)": TABLE / f"seed{seed}" / "fedtrans",
        "FedAvg (initial model), 100 rounds (the table)": TABLE / f"seed{seed}" / "fedavg",
    }
    dirs |= {names[m]: d for m, d in got.items() if (d / "summary.json").is_file()}
    text = [
        f"# Ablation (CIFAR-like, `cpu.yaml`, seed {seed}): round cap or method?",
        "",
        f"`PYTHONPATH=$PWD python experiments/fedtrans/ablate_cap.py --seed {seed} --long {args.long} --early "
        f"{' '.join(map(str, args.early))}`; the 100-round rows are the table's runs (`records/cifar_like/`).",
        "",
        table(dirs),
        "FedTrans's transformations:",
        "",
        *transformations(dirs),
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ablation_cap.md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
