"""What one round of in-place distillation does to the same global model: test accuracy and loss before and after.

    python experiments/distill/probe.py CONFIG [--rounds 10 30] [--iterations 5 20 100] [--out FILE] [key=value ...]

For each R of ``--rounds``, CONFIG's method is run for R rounds *without* distillation (in-process, nothing written);
the global model it ends with is the aggregate that round R-1's distillation would start from. That model is then
distilled once per variant (``shared``: Eq. 2 on the global weights, teacher ``W^{t-1}``; ``shared-frozen``: the same
with the teacher frozen at the aggregated model, ``distill.teacher=round``; ``copies``: copy-and-average) and T_SKD of
``--iterations``, with CONFIG's other distillation settings (n, K, lr, temperature), and evaluated as the engine
evaluates it (the algorithm's ``eval_params``: HeteroFL's static BN included). The server step is thus isolated from
the training that follows it: a negative change means the distillation itself moves the model away from the data.
Prints a markdown table (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

VARIANTS = {  # name: (distill.update, distill.teacher)
    "shared": ("shared", "step"),
    "shared-frozen": ("shared", "round"),
    "copies": ("copies", "step"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--rounds", type=int, nargs="+", default=[10, 30])
    parser.add_argument("--iterations", type=int, nargs="+", default=[5, 20, 100])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch

    from rayfl.algorithms.distill import inplace_distill
    from rayfl.algorithms.payloads import ServerState
    from rayfl.config_loader import load_config
    from rayfl.engine.build import bind_algorithm, build_backend, build_clock, build_setup
    from rayfl.engine.driver import run_experiment

    torch.set_num_threads(1)
    base = load_config(args.config, args.overrides)
    distill = base.algorithm.distill  # type: ignore[union-attr]
    plain = dataclasses.replace(base.algorithm, distill=dataclasses.replace(distill, enabled=False))
    cfg = dataclasses.replace(base, algorithm=plain, backend=dataclasses.replace(base.backend, kind="local"))
    setup = build_setup(cfg)
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    algorithm = setup.algorithm
    backend = build_backend(cfg, setup)
    family = algorithm.require_family()  # type: ignore[attr-defined]
    ratios = distill.ratios or algorithm.distill_ratios()  # type: ignore[attr-defined]
    n = distill.subnets or cfg.clients_per_round
    lines = [
        f"{args.config} {' '.join(args.overrides)}: {cfg.algorithm.name}, n = {n}, K = {distill.batch_size}, "
        f"lr {distill.lr:g}, temperature {distill.temperature:g}",
        "",
        "| after round | variant | T_SKD | test acc before | test acc after | change (points) | test loss before "
        "| test loss after | server s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for rounds in args.rounds:
        result = run_experiment(dataclasses.replace(cfg, rounds=rounds), write=False, dataset=setup.dataset)
        state = result.state
        before = backend.evaluate(algorithm.eval_params(state))
        for variant in args.variants:
            update, teacher = VARIANTS[variant]
            for iterations in args.iterations:
                dcfg = dataclasses.replace(distill, enabled=True, update=update, teacher=teacher, iterations=iterations)
                began = time.perf_counter()
                out = inplace_distill(
                    family,
                    state.params,
                    dcfg,
                    ratios,
                    num_subnets=n,
                    seed=cfg.seed,
                    round_idx=rounds - 1,
                    input_spec=setup.input_spec,
                )
                spent = time.perf_counter() - began
                after = backend.evaluate(algorithm.eval_params(ServerState(params=out.params, round_idx=rounds)))
                line = (
                    f"| {rounds} | {variant} | {iterations} | {100 * before.accuracy:.2f} | {100 * after.accuracy:.2f} "
                    f"| {100 * (after.accuracy - before.accuracy):+.2f} | {before.loss:.3f} | {after.loss:.3f} "
                    f"| {spent:.1f} |"
                )
                lines.append(line)
                print(line, flush=True)
    backend.close()
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
