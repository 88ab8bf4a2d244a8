"""Issue 24's second ablation: do the FEMNIST-like setting's 5 clients a round explain why FedTrans falls behind?

    PYTHONPATH=$PWD python experiments/fedtrans/ablate_clients.py [--seeds 0 1] [--clients 10]
        [--records experiments/fedtrans/records/femnist_like_ablation] [--out experiments/fedtrans/issue24]
    PYTHONPATH=$PWD python experiments/fedtrans/ablate_clients.py --seeds 0 1 \
        --from-records experiments/fedtrans/records/femnist_like_ablation

``femnist_nb201.yaml`` runs 5 clients a round where ``femnist.yaml`` (and paper 002's protocol, scaled) runs 10: a cut
made for CPU time. FedTrans splits each round's clients over its models, so it is the method a smaller cohort should
hurt most. Per seed this runs FedTrans and FedAvg (initial model) with ``--clients`` clients a round and the table's
100 rounds, and sets them beside the table's own 5-client runs of that seed (``records/femnist_like/seed<S>/``). If
the cut explains the gap, FedTrans gains more from the larger cohort than FedAvg does. Writes
``ablation_clients_femnist.md`` to ``--out`` (``ablate_cap.py``'s columns, and FedTrans's transformations).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablate_cap import table, transformations
from run_table import ablation_args, run_plans

HERE = Path(__file__).resolve().parent
TABLE = HERE / "records" / "femnist_like"
CONFIG = HERE / "femnist_nb201.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=100)
    args = ablation_args(parser, "runs/i24-femnist-clients", "femnist_like_ablation")
    k = args.clients
    names = {
        f"fedtrans-c{k}": f"FedTrans, {k} clients a round",
        f"fedavg-c{k}": f"FedAvg (initial model), {k} clients a round",
    }
    sections: list[str] = []
    for seed in args.seeds:
        if args.from_records is not None:
            got = {m: args.from_records / f"seed{seed}" / m for m in names}
        else:
            common = [f"seed={seed}", f"rounds={args.rounds}", f"clients_per_round={k}"]
            plans = {f"fedtrans-c{k}": common, f"fedavg-c{k}": [*common, "algorithm.name=fedavg"]}
            got = run_plans(CONFIG, plans, args.runs / f"seed{seed}", seed, args.records)
        dirs = {
            "FedTrans, 5 clients a round (the table)": TABLE / f"seed{seed}" / "fedtrans",
            "FedAvg (initial model), 5 clients a round (the table)": TABLE / f"seed{seed}" / "fedavg",
        }
        dirs |= {names[m]: d for m, d in got.items() if (d / "summary.json").is_file()}
        sections += [f"## Seed {seed}", "", table(dirs), "FedTrans's transformations:", "", *transformations(dirs), ""]
    text = [
        "# Ablation (FEMNIST-like, `femnist_nb201.yaml`): clients a round",
        "",
        f"`PYTHONPATH=$PWD python experiments/fedtrans/ablate_clients.py --seeds {' '.join(map(str, args.seeds))} "
        f"--clients {k}`; the 5-client rows are the table's runs (`records/femnist_like/`), {args.rounds} rounds each.",
        "",
        *sections,
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ablation_clients_femnist.md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
