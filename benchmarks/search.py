"""Resource-constrained model search: server time per round (paper 000, Algorithm 2 as ``rayfl.fl.common.search``).

120 clients per round on ResNet152 (CIFAR-10, 10 classes, batch 64, SGD with momentum), S = {0, 0.0625, 0.125, 0.25,
0.5, 1}, epsilon = 0.8, T_max = 5. Every round each client gets fresh budgets: training memory uniform between the
smallest and the largest structure's peak memory, and bandwidth (bytes it may move in the round) uniform between the
smallest and the largest structure's bytes down + up. The clients are drawn from a population of 1000. Reported: the
search time per round (median and max, the first round included), distinct structures assigned, hit rate (clients
that reached T_max), pool size, and how much of each budget the choices use.

Run: ``python benchmarks/search.py [--rounds 20] [--clients 120] [--depth 152]``
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the search runs on one server core
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np

S = (0.0, 0.0625, 0.125, 0.25, 0.5, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=120)
    parser.add_argument("--population", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=152, choices=(18, 34, 50, 101, 152))
    parser.add_argument("--epsilon", type=float, default=0.8)
    parser.add_argument("--t-max", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from rayfl.config.model import ResNetConfig
    from rayfl.core.messages import ClientView
    from rayfl.core.rng import derive_rng
    from rayfl.fl.common.search import ModelSearch
    from rayfl.models.elastic.cost import CostModel
    from rayfl.models.elastic.resnet import ResNetFamily

    fam = ResNetFamily(ResNetConfig(depth=args.depth), num_classes=10)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    cost = CostModel(fam, batch_size=64, optimizer="sgd", momentum=0.9)
    setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    search = ModelSearch(fam.space, cost, S, epsilon=args.epsilon, t_max=args.t_max, seed=args.seed)
    init_s = time.perf_counter() - t0
    ends = cost.evaluate(np.array([search.smallest, search.largest]))
    mem_lo, mem_hi = ends.peak_memory
    comm_lo, comm_hi = ends.bytes_down + ends.bytes_up
    print(
        f"ResNet{args.depth}: {len(fam.space.dims)} dimensions ({int(fam.space.skippable.sum())} skippable), "
        f"S = {S}, epsilon = {args.epsilon}, T_max = {args.t_max}, {args.clients} clients per round"
    )
    print(
        f"smallest: {ends.params[0]:,.0f} params, {mem_lo / 2**20:.1f} MiB, {comm_lo / 2**20:.2f} MiB down+up; "
        f"largest: {ends.params[1]:,.0f} params, {mem_hi / 2**20:.1f} MiB, {comm_hi / 2**20:.1f} MiB down+up"
    )
    print(
        f"cost model ready in {setup_s:.2f} s (fits cached on disk after the first run), "
        f"search init {init_s * 1e3:.1f} ms"
    )

    times, hits, mem_use, comm_use, fits = [], [], [], [], []
    last = None
    for r in range(args.rounds):
        rng = derive_rng(args.seed, "bench-budgets", r)
        ids = rng.choice(args.population, size=args.clients, replace=False)
        mem_b = rng.uniform(mem_lo, mem_hi, args.clients)
        comm_b = rng.uniform(comm_lo, comm_hi, args.clients)
        views = [ClientView(int(c), 500, float(m), float(b)) for c, m, b in zip(ids, mem_b, comm_b, strict=True)]
        last = search.assign_round(views, r)
        times.append(last.search_s)
        hits.append(last.hit_rate)
        by_id = {v.client_id: v for v in views}
        for ch in last.choices:
            fits.append(ch.fits)
            mem_use.append(ch.peak_memory / by_id[ch.client_id].memory_budget)
            comm_use.append(ch.comm_bytes / by_id[ch.client_id].bandwidth_budget)
    assert last is not None
    ms = np.array(times) * 1e3
    print(
        f"search per round over {args.rounds} rounds: median {np.median(ms):.2f} ms, max {ms.max():.2f} ms "
        f"(first round {ms[0]:.2f} ms, last {ms[-1]:.2f} ms)"
    )
    print(
        f"distinct structures assigned: {last.distinct_assigned} of {args.rounds * args.clients} assignments; "
        f"pool size {last.pool_size}; hit rate {np.mean(hits):.4f} (expected (1 - epsilon)^T_max = "
        f"{(1 - args.epsilon) ** args.t_max:.4f})"
    )
    print(
        f"clients fitted: {np.mean(fits):.1%}; budget used by the choice (mean): memory {np.mean(mem_use):.1%}, "
        f"bandwidth {np.mean(comm_use):.1%}"
    )


if __name__ == "__main__":
    main()
