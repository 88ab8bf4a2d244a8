"""Search-only runs (paper 000, App. E.1): set-up and per-round cost on the full-size setting-6 budgets.

Takes the base experiment of ``experiments/sweeps/search_eps_tmax.yaml`` (BERT-large, S = {0, 0.5, 1}, 120 of the 993
Shakespeare roles per round, memory 4 or 8 GiB, bandwidth from the mahimahi cellular logs) at one (epsilon, T_max)
point and prints: the time to load the data, to build the global model on the meta device (what search-only does)
and, with ``--materialise``, on the CPU with initialised weights (what a training run does), to build the cost oracle
(fits of the cost pieces, cached on disk after the first run), and the wall seconds per search-only round (median and
max) with the search's own share.

Run: ``python benchmarks/search_only.py [--rounds 20] [--epsilon 0.8] [--t-max 5] [--materialise]``
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np

SWEEP = Path(__file__).resolve().parents[1] / "experiments" / "sweeps" / "search_eps_tmax.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--epsilon", type=float, default=0.8)
    parser.add_argument("--t-max", type=int, default=5)
    parser.add_argument("--materialise", action="store_true", help="also time building BERT-large with real weights")
    args = parser.parse_args()

    import torch

    from rayfl.data import build_federated_dataset
    from rayfl.engine.build import initial_params
    from rayfl.engine.search_only import meta_params, run_search_only
    from rayfl.models import InputSpec
    from rayfl.system.costs import CostOracle
    from rayfl.tune import load_sweep

    sweep = load_sweep(SWEEP, [f"base.rounds={args.rounds}"])
    cfg = sweep.plan.config({"algorithm.epsilon": args.epsilon, "algorithm.t_max": args.t_max})
    began = time.perf_counter()
    data = build_federated_dataset(cfg.data, cfg.seed, None)
    load_s = time.perf_counter() - began
    spec = InputSpec.of(data.input_kind, data.num_classes, data.x, data.meta)
    began = time.perf_counter()
    params = meta_params(cfg, spec)
    meta_s = time.perf_counter() - began
    numel = sum(t.numel() for t in params.values())
    shapes = {k: tuple(v.shape) for k, v in params.items()}
    began = time.perf_counter()
    CostOracle(cfg.model, spec, cfg.train, shapes)
    oracle_s = time.perf_counter() - began
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; {data.num_clients} clients, {len(data.y)} windows")
    print(f"model {cfg.model.name} size={getattr(cfg.model, 'size', '?')}: {numel / 1e6:.1f} M parameters")
    print(f"data load {load_s:.2f} s | meta-device model {meta_s:.2f} s | cost oracle {oracle_s:.2f} s")
    if args.materialise:
        began = time.perf_counter()
        real = initial_params(cfg, spec)
        print(f"materialised model with initialised weights: {time.perf_counter() - began:.2f} s, ", end="")
        print(f"{sum(t.numel() * t.element_size() for t in real.values()) / 2**30:.2f} GiB")
        del real
    began = time.perf_counter()
    result = run_search_only(cfg, write=False, dataset=data)
    total = time.perf_counter() - began
    walls = np.array([r.round_wall_s for r in result.records])
    search = np.array([r.search_s for r in result.records])
    print(
        f"{len(walls)} rounds of {cfg.clients_per_round} clients in {total:.2f} s (set-up included): round wall "
        f"median {1000 * np.median(walls):.1f} ms, max {1000 * walls.max():.1f} ms; search median "
        f"{1000 * np.median(search):.2f} ms"
    )
    print(
        f"memory util {result.mean('memory_util'):.3f} | bandwidth util {result.mean('bandwidth_util'):.3f} | "
        f"hit rate {result.mean('hit_rate'):.3f} | structures {result.records[-1].distinct_structures:.0f}"
    )


if __name__ == "__main__":
    main()
