"""Server seconds per round of federated in-place distillation (paper 000, Algorithm 1) on the CPU settings.

For each setting YAML: its model, data shape and search space S, the global model at its initial weights, and one
round of distillation with the paper's hyper-parameters (T_SKD = 100 iterations, n = the setting's clients per
round, K = 64, Adam lr 0.001), once per update rule: ``shared`` (Eq. 2: the sub-nets' gradients on the shared
weights, one Adam step on the global model per iteration) and ``copies`` (each sub-net its own copy and Adam, merged
at the end). Both draw the same sub-nets and noise, so their ratio compares the update rules on equal work.
``copies`` runs once per ``--workers`` value (copies trained at the same time, one thread each; the result is the same
for every value) on ``--device``. Prints a markdown table of wall seconds and CPU seconds (the process's CPU time,
which other processes' load inflates less than wall time) per round.

Run: ``python benchmarks/distill_server.py [--iterations 100] [--batch 64] [--workers 1 2] [--device cpu]
[--set data.name=synthetic] [experiments/paper/cpu/setting1.yaml ...]`` (the paper-size configs,
``experiments/paper/setting1.yaml``, with ``--device cuda --set data.name=synthetic``: CIFAR-shaped images)
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

DEFAULT = [f"experiments/paper/cpu/setting{n}.yaml" for n in range(1, 7)] + ["experiments/mini/shakespeare_bert.yaml"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("configs", nargs="*", default=DEFAULT)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--subnets", type=int, default=0, help="0: the setting's clients per round (the paper's n)")
    parser.add_argument("--updates", nargs="+", default=["shared", "copies"], choices=["shared", "copies"])
    parser.add_argument("--workers", nargs="+", type=int, default=[1], help="distill.workers values for copies")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--set", nargs="*", default=[], help="config overrides for every config, e.g. data.name=synthetic (paper-size)"
    )
    args = parser.parse_args()

    import torch

    from rayfl.engine.build import build_setup
    from rayfl.experiment.loader import load_config
    from rayfl.fl.common.distill.config import DistillConfig
    from rayfl.fl.common.distill.server import inplace_distill
    from rayfl.models.families import build_family

    torch.set_num_threads(1)
    variants = [(u, w) for u in args.updates for w in (args.workers if u == "copies" else [1])]
    names = [u if u == "shared" else f"copies x{w} {args.device}" for u, w in variants]
    heads = " | ".join(f"{u} wall s | {u} CPU s" for u in names)
    print(f"| config | model params | n | K | T_SKD | {heads} |")
    print(f"|---|---|---|---|---|{'---|---|' * len(variants)}")
    for path in args.configs:
        cfg = load_config(path, args.set)
        setup = build_setup(cfg)
        family = build_family(cfg.model, setup.input_spec)
        ratios = getattr(cfg.algorithm, "ratios", (0.0, 0.5, 1.0))
        n = args.subnets or cfg.clients_per_round
        seconds = []
        for update, workers in variants:
            dcfg = DistillConfig(
                enabled=True,
                iterations=args.iterations,
                batch_size=args.batch,
                update=update,
                workers=workers,
                device=args.device,
            )
            if args.device == "cuda":
                torch.cuda.synchronize()
            began, cpu = time.perf_counter(), time.process_time()
            inplace_distill(
                family,
                setup.params,
                dcfg,
                ratios,
                num_subnets=n,
                seed=cfg.seed,
                round_idx=0,
                input_spec=setup.input_spec,
            )
            if args.device == "cuda":
                torch.cuda.synchronize()
            seconds += [time.perf_counter() - began, time.process_time() - cpu]
        size = sum(v.numel() for v in setup.params.values())
        cells = " | ".join(f"{s:.1f}" for s in seconds)
        print(f"| {path} | {size:,} | {n} | {args.batch} | {args.iterations} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
