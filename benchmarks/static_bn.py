"""Seconds of HeteroFL's static batch-norm pass (``fl/methods/heterofl/algorithm.py``) per evaluation: the pooled
training set of a setting in batches of ``static_bn_batch_size`` (10, the official code's), batch by batch through the
model's own batch norms (before issue 41), in chunks of many batches per forward on one thread, and the same chunks on
``--workers`` threads at once (``static_bn_workers``, default every core), with the largest gap between the
batch-by-batch and chunked statistics and whether the threaded pass gives the one-thread pass's bits. One intra-op
thread; the three passes alternate, ``--repeat`` times each (the minimum is printed).

Run: ``python benchmarks/static_bn.py [--repeat 3] [--chunk 512] [--workers 2] [experiments/paper/cpu/setting1.yaml]``
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

DEFAULT = ["experiments/paper/cpu/setting1.yaml", "experiments/paper/cpu/setting3.yaml"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("configs", nargs="*", default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--workers", type=int, default=0, help="threads of the threaded pass (0: every core)")
    args = parser.parse_args()

    import torch

    from rayfl.core.cores import usable_cores
    from rayfl.core.rng import derive_rng
    from rayfl.engine.build import build_setup
    from rayfl.experiment.loader import load_config
    from rayfl.fl.methods.heterofl.algorithm import (
        static_bn_batches,
        static_bn_statistics,
        static_bn_statistics_sequential,
        tracked_global_model,
    )
    from rayfl.models.families import build_family

    torch.set_num_threads(1)
    workers = args.workers or usable_cores()
    print(
        f"| config | samples | batch | batch by batch s | chunked s | chunked, {workers} threads s | speed-up "
        "| largest statistic gap | threads: same bits |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for path in args.configs:
        cfg = load_config(path, ["algorithm.name=heterofl"])
        setup = build_setup(cfg)
        family = build_family(cfg.model, setup.input_spec)
        model = tracked_global_model(family)
        if model is None:
            print(f"| {path} | - | - | no batch norm | | | |")
            continue
        model.load_state_dict(setup.params, strict=False)
        x, spec, size = setup.dataset.x, setup.input_spec, int(getattr(cfg.algorithm, "static_bn_batch_size", 10))
        times: dict[str, list[float]] = {"seq": [], "chunk": [], "threads": []}
        out = {}
        for _ in range(args.repeat):
            began = time.perf_counter()
            out["seq"] = static_bn_statistics_sequential(
                model, x, spec, static_bn_batches(len(x), size, derive_rng(cfg.seed, "static_bn", 0))
            )
            times["seq"].append(time.perf_counter() - began)
            began = time.perf_counter()
            out["chunk"] = static_bn_statistics(model, x, spec, size, derive_rng(cfg.seed, "static_bn", 0), args.chunk)
            times["chunk"].append(time.perf_counter() - began)
            began = time.perf_counter()
            rng = derive_rng(cfg.seed, "static_bn", 0)
            out["threads"] = static_bn_statistics(model, x, spec, size, rng, args.chunk, workers)
            times["threads"].append(time.perf_counter() - began)
        gap = max(float((out["seq"][k] - out["chunk"][k]).abs().max()) for k in out["seq"])
        same = all(torch.equal(out["chunk"][k], out["threads"][k]) for k in out["chunk"])
        seq, chunk, threads = min(times["seq"]), min(times["chunk"]), min(times["threads"])
        print(
            f"| {path} | {len(x)} | {size} | {seq:.2f} | {chunk:.2f} | {threads:.2f} | x{seq / threads:.1f} "
            f"| {gap:.2g} | {'yes' if same else 'NO'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
