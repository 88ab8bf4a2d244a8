"""Where a research run's wall time goes (issue 41, item 5): each method of paper 000's comparison on the CPU paper
settings, a few rounds each, in-process, with the wall seconds by part read from the run's own round records.

Columns (seconds over the run unless noted): ``total`` (``run_experiment`` end to end), ``set-up`` (data, algorithm,
initial model, backend: ``RunResult.startup_s``), ``rounds`` (the rounds' ``round_wall_s``), ``train`` (round start
to the new global model: the clients' training, the aggregation and the server update, ``train_wall_s``),
``eval`` (``eval_wall_s``), ``server`` (``server_train_s``: in-place distillation, which is part of ``train``, and
HeteroFL's static-BN pass, which is part of ``eval``), ``search`` (the model search, part of ``train``),
``checkpoint`` and ``eval %`` (eval over total). The methods and their overrides are ``experiments/paper/run_cpu.sh``'s
(HeteroFL and FedRolex with their official set-up, so HeteroFL evaluates with static BN), except FedAvg smallest in
setting 5, which is ViT-tiny-tiny as in ``experiments/issue40/``. One torch thread. ``--eval-every 1`` (the default,
so each part is measured each round) evaluates every round; ``--eval-every 0`` keeps the setting's own schedule
(``eval_every: 2`` in every CPU setting), which is what a research run pays.

Run: ``python benchmarks/research_runs.py [--settings 1 3 5] [--rounds 2] [--eval-every 1] [--methods largest ...]``
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

METHODS = [
    "largest",
    "smallest",
    "heterofl",
    "fedrolex",
    "fjord",
    "model_search-no-distill",
    "model_search",
    "heterofl-distill",
]


def overrides(method: str, setting: int, ratios: str, distill: list[str]) -> list[str]:
    """``experiments/paper/run_cpu.sh``'s ``method_overrides``."""
    smallest = "[0.0625]" if setting in (1, 2) else ratios
    table = {
        "largest": ["algorithm.name=fedavg", "algorithm.budgets=ignore"],
        # setting 5: Table 2's ViT-tiny-tiny, as experiments/issue40/run_setting.sh (S's own smallest has no block)
        "smallest": ["algorithm.name=fedavg", "algorithm.model=smallest", f"algorithm.ratios={smallest}"]
        + (["algorithm.smallest_blocks=[1]"] if setting == 5 else []),
        "heterofl": ["algorithm.name=heterofl"],
        "fedrolex": ["algorithm.name=fedrolex"],
        "fjord": ["algorithm.name=fjord"],
        "model_search-no-distill": ["algorithm.distill.enabled=false"],
        "model_search": [],
        "heterofl-distill": ["algorithm.name=heterofl", *distill],
    }
    return table[method]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", nargs="+", type=int, default=[1, 3, 5])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=1, help="0: the setting's own eval_every")
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    args = parser.parse_args()

    import torch

    from rayfl.engine.driver import run_experiment
    from rayfl.experiment.loader import load_config

    torch.set_num_threads(1)
    print(
        "| setting | method | total s | set-up s | rounds s | train s | eval s | server s | search s | checkpoint s "
        "| eval % |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for setting in args.settings:
        path = f"experiments/paper/cpu/setting{setting}.yaml"
        algo: Any = load_config(path).algorithm  # model_search: ratios and distill
        ratios = "[" + ",".join(f"{r:g}" for r in algo.ratios) + "]"
        d = algo.distill
        distill = [
            "algorithm.distill.enabled=true",
            f"algorithm.distill.subnets={d.subnets}",
            f"algorithm.distill.iterations={d.iterations}",
            f"algorithm.distill.batch_size={d.batch_size}",
            f"algorithm.distill.lr={d.lr:g}",
            f"algorithm.distill.update={d.update}",
        ]
        for method in args.methods:
            with tempfile.TemporaryDirectory() as out:
                common = [
                    f"rounds={args.rounds}",
                    *([f"eval_every={args.eval_every}"] if args.eval_every else []),
                    f"output_dir={out}",
                    "checkpoint.every=0",
                    "export.final=false",
                    "tracking.tensorboard=false",
                ]
                cfg = load_config(path, [*common, *overrides(method, setting, ratios, distill)])
                began = time.perf_counter()
                run = run_experiment(cfg)
                total = time.perf_counter() - began

            def part(name: str, records: tuple[object, ...] = tuple(run.records)) -> float:
                return sum(v for r in records if not math.isnan(v := float(getattr(r, name))))

            rounds, evals = part("round_wall_s"), part("eval_wall_s")
            cells = [
                total,
                sum(run.startup_s.values()),
                rounds,
                part("train_wall_s"),
                evals,
                part("server_train_s"),
                part("search_s"),
                part("checkpoint_s"),
            ]
            row = " | ".join(f"{c:.1f}" for c in cells)
            print(f"| {setting} | {method} | {row} | {100 * evals / total:.0f} |", flush=True)


if __name__ == "__main__":
    main()
