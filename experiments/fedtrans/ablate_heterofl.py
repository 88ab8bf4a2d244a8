"""Issue 24's third ablation: which part of HeteroFL's set-up puts it far below FLuID on the same model?

    PYTHONPATH=$PWD python experiments/fedtrans/ablate_heterofl.py [--config cifar_mobilenet.yaml] [--seed 0]
        [--records experiments/fedtrans/records/cifar_like_mobilenet_heterofl] [--out experiments/fedtrans/issue24]
    PYTHONPATH=$PWD python experiments/fedtrans/ablate_heterofl.py \
        --from-records experiments/fedtrans/records/cifar_like_mobilenet_heterofl

In the CIFAR-like table from ``mobilenet_tiny`` HeteroFL and FLuID train the same largest model at nearly the same
MACs, yet HeteroFL ends about 20 points lower. rayfl's HeteroFL runs as its authors ran it (``heterofl/config.py``):
label masking in the local loss, static batch norm for evaluation, gradient clipping at norm 1, the official initial
model and the official activation (ReLU in place of the model's hard-swish). Per run this turns one of them off
(and, last, all of them), with the table's data, budgets, seed, rounds and model (FedTrans's largest model of that
seed, read from the table's records), and sets the runs beside the table's HeteroFL and FLuID. Writes
``ablation_heterofl.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablate_cap import table
from run_table import ablation_args, heterofl_overrides, resolve_config, run_plans

HERE = Path(__file__).resolve().parent

VARIANTS = {
    "heterofl-no-mask": ("HeteroFL without label masking", ["algorithm.label_mask=false"]),
    "heterofl-no-sbn": ("HeteroFL without static BN", ["algorithm.static_bn=false"]),
    "heterofl-no-clip": ("HeteroFL without clipping", ["algorithm.grad_clip_norm=0"]),
    "heterofl-no-init": ("HeteroFL without the official init", ["algorithm.official_init=false"]),
    "heterofl-model-act": ("HeteroFL with the model's activation", ["algorithm.act=model"]),
    "heterofl-none": (
        "HeteroFL with none of the five",
        [
            "algorithm.label_mask=false",
            "algorithm.static_bn=false",
            "algorithm.grad_clip_norm=0",
            "algorithm.official_init=false",
            "algorithm.act=model",
        ],
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cifar_mobilenet.yaml")
    parser.add_argument("--table", type=Path, default=HERE / "records" / "cifar_like_mobilenet")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=100)
    args = ablation_args(parser, "runs/i24-heterofl-ablation", "cifar_like_mobilenet_heterofl")
    seed, table_dir = args.seed, args.table / f"seed{args.seed}"
    if args.from_records is not None:
        got = {m: args.from_records / f"seed{seed}" / m for m in VARIANTS}
    else:
        family = json.loads((table_dir / "fedtrans" / "summary.json").read_text())["fedtrans"]["models"]
        common = [f"seed={seed}", f"rounds={args.rounds}", *heterofl_overrides(family[-1])]
        plans = {name: [*common, *overrides] for name, (_, overrides) in VARIANTS.items()}
        got = run_plans(resolve_config(args.config), plans, args.runs / f"seed{seed}", seed, args.records)
    dirs = {
        "HeteroFL (the table)": table_dir / "heterofl",
        "FLuID (the table)": table_dir / "fluid",
        **{VARIANTS[m][0]: d for m, d in got.items() if (d / "summary.json").is_file()},
    }
    shown = args.table.resolve().relative_to(HERE)
    text = [
        f"# Ablation ({args.config}, seed {seed}): HeteroFL's set-up against FLuID on the same model",
        "",
        f"`PYTHONPATH=$PWD python experiments/fedtrans/ablate_heterofl.py --config {args.config} --seed {seed}`; the "
        f"first two rows are the table's runs (`{shown}/`), {args.rounds} rounds each.",
        "",
        table(dirs),
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ablation_heterofl.md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
