"""What one round of in-place distillation does to the same global model: test accuracy and loss before and after.

    python experiments/distill/probe.py CONFIG [--rounds 10 30] [--iterations 5 20 100] [--variants ...]
        [--sgd-lr 0.001 0.1] [--out FILE] [key=value ...]

For each R of ``--rounds``, CONFIG's method is run for R rounds *without* distillation (in-process, nothing written);
the global model it ends with is the aggregate that round R-1's distillation would start from. That model is then
distilled once per variant (``shared``: Eq. 2 on the global weights, teacher ``W^{t-1}``; ``shared-frozen``: the same
with the teacher frozen at the aggregated model, ``distill.teacher=round``; ``copies``: copy-and-average;
``shared-sgd``: Eq. 2 with plain SGD in place of Adam, ``distill.optimizer=sgd``, at each lr of ``--sgd-lr``) and T_SKD
of ``--iterations``, with CONFIG's other distillation settings (n, K, lr, temperature), and evaluated as the engine
evaluates it (the algorithm's ``eval_params``: HeteroFL's static BN included). The server step is thus isolated from
the training that follows it: a negative change means the distillation itself moves the model away from the data.

Beside accuracy and loss, each row says how far the step moved the weights and what it did to its own objective:
``|dW|/|W|``, the L2 norm of the change over the L2 norm of the trained weights; ``mean |dw| / (lr T)``, the mean
absolute change of the elements that moved over ``lr x T_SKD`` (about 1 when every step moves every weight by about
``lr`` in a consistent direction, as Adam's normalised steps can); and the KD loss between the global model and the
round's sub-nets on fresh Gaussian inputs (``distill.distillation_gap``), before and after.
Prints a markdown table (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

VARIANTS = {  # name: (distill.update, distill.teacher, distill.optimizer)
    "shared": ("shared", "step", "adam"),
    "shared-frozen": ("shared", "round", "adam"),
    "copies": ("copies", "step", "adam"),
    "shared-sgd": ("shared", "step", "sgd"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--rounds", type=int, nargs="+", default=[10, 30])
    parser.add_argument("--iterations", type=int, nargs="+", default=[5, 20, 100])
    parser.add_argument("--variants", nargs="+", default=["shared", "shared-frozen", "copies"], choices=list(VARIANTS))
    parser.add_argument("--sgd-lr", type=float, nargs="+", default=[0.001, 0.1], help="lrs of the shared-sgd variant")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch

    from rayfl.core.messages import ServerState
    from rayfl.core.rng import derive_rng
    from rayfl.engine.build import bind_algorithm, build_backend, build_clock, build_setup
    from rayfl.engine.driver import run_experiment
    from rayfl.experiment.loader import load_config
    from rayfl.fl.api import capabilities
    from rayfl.fl.common.distill.server import distillation_gap, inplace_distill, sample_structures

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
        "| after round | variant | lr | T_SKD | test acc before | test acc after | change (points) | test loss before "
        "| test loss after | \\|dW\\|/\\|W\\| | mean \\|dw\\| / (lr T) | KD loss before | KD loss after | server s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for rounds in args.rounds:
        result = run_experiment(dataclasses.replace(cfg, rounds=rounds), write=False, dataset=setup.dataset)
        state = result.state
        before = backend.evaluate(capabilities.eval_params(algorithm, state))
        structures = sample_structures(family.space, ratios, n, derive_rng(cfg.seed, "distill", rounds - 1))
        gap = functools.partial(
            distillation_gap, family, structures=structures, input_spec=setup.input_spec,
            batch_size=distill.batch_size, temperature=distill.temperature, seed=cfg.seed,
        )  # fmt: skip
        gap_before = gap(state.params)
        trained = [k for k, v in state.params.items() if v.is_floating_point()]
        weights = torch.cat([state.params[k].reshape(-1) for k in trained])
        runs = [
            (variant, lr, iterations)
            for variant in args.variants
            for lr in (args.sgd_lr if VARIANTS[variant][2] == "sgd" else [distill.lr])
            for iterations in args.iterations
        ]
        for variant, lr, iterations in runs:
            update, teacher, optimizer = VARIANTS[variant]
            dcfg = dataclasses.replace(
                distill, enabled=True, update=update, teacher=teacher, optimizer=optimizer, lr=lr, iterations=iterations
            )
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
            evaluated = capabilities.eval_params(algorithm, ServerState(params=out.params, round_idx=rounds))
            after = backend.evaluate(evaluated)
            delta = torch.cat([(out.params[k] - state.params[k]).reshape(-1) for k in trained])
            moved = delta[delta != 0].abs()
            step_ratio = float(moved.mean()) / (lr * iterations) if len(moved) else 0.0
            line = (
                f"| {rounds} | {variant} | {lr:g} | {iterations} | {100 * before.accuracy:.2f} "
                f"| {100 * after.accuracy:.2f} | {100 * (after.accuracy - before.accuracy):+.2f} "
                f"| {before.loss:.3f} | {after.loss:.3f} | {float(delta.norm() / weights.norm()):.4f} "
                f"| {step_ratio:.3g} | {gap_before:.4f} | {gap(out.params):.4f} | {spent:.1f} |"
            )
            lines.append(line)
            print(line, flush=True)
    backend.close()
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
