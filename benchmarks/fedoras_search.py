"""FedorAS search: candidate evaluations spread over Ray tasks, 1 worker against 2, measured in one run.

A CPU-sized supernet of the paper's CIFAR-10 space (stem 16, stages of 2-2-2 blocks, all nine ops, 32x32 images),
randomly initialised; ``--paths`` paths sampled under the largest path's FLOPs are scored on ``--val`` synthetic
validation images by ``evaluate_paths`` (the search phase's fitness), first in-process, then as Ray tasks split into 1
and into 2 chunks (the search's ``workers``). Prints wall seconds, the speed-up and whether the accuracies are equal.

Run (on a quiet machine with at least 2 free cores; the default sizes are the figure's):
``PYTHONPATH=$PWD python benchmarks/fedoras_search.py --paths 16 --val 512 --repeats 2``. It exits with an error when
the accuracies of 1 worker, 2 workers and in-process differ.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--paths", type=int, default=16)
    parser.add_argument("--val", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import ray

    from rayfl.config.model import SupernetConfig
    from rayfl.engine.ray.server_tasks import RayTaskPool
    from rayfl.fl.api.tasks import LocalTaskPool
    from rayfl.fl.methods.fedoras.algorithm import op_tables
    from rayfl.fl.methods.fedoras.sampling import path_flops, path_rng, sample_path
    from rayfl.fl.methods.fedoras.search import evaluate_paths
    from rayfl.models.elastic.cost import CostModel
    from rayfl.models.inputs import InputSpec
    from rayfl.models.supernet import SupernetFamily

    family = SupernetFamily(SupernetConfig(stem_channels=16, blocks_per_stage=(2, 2, 2)), 3, 10, image_size=32)
    tables = op_tables(family, CostModel(family, 32))
    full = np.ones_like(tables.params, dtype=bool)
    paths = np.stack([sample_path(tables, full, tables.max_flops, path_rng(0, 0, 0, b)) for b in range(args.paths)])
    torch.manual_seed(0)
    params = {k: v.detach().numpy() for k, v in family.global_model().state_dict().items()}
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(args.val, 3, 32, 32), dtype=np.uint8)
    y = rng.integers(0, 10, size=args.val)
    spec = InputSpec.of("image", 10, x, {"mean": [0.5] * 3, "std": [0.25] * 3})
    shared = (family, params, x, y, spec, 128)
    print(f"{args.paths} paths, mean {path_flops(tables, paths).mean() / 1e6:.1f} MFLOPs, {args.val} val images")

    local = np.concatenate(LocalTaskPool().map(evaluate_paths, shared, [paths]))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pool = RayTaskPool()
        pool.map(evaluate_paths, shared, np.array_split(paths[:2], 2))  # warm up both workers (torch import)
        seconds: dict[int, float] = {}
        equal = True
        for workers in (1, 2) * args.repeats:
            began = time.perf_counter()
            out = np.concatenate(pool.map(evaluate_paths, shared, np.array_split(paths, workers)))
            elapsed = time.perf_counter() - began
            seconds[workers] = min(seconds.get(workers, np.inf), elapsed)
            equal = equal and np.array_equal(out, local)
            print(
                f"  {workers} worker(s): {elapsed:.2f} s, same accuracies as in-process: {np.array_equal(out, local)}"
            )
        print(
            f"best of {args.repeats}: 1 worker {seconds[1]:.2f} s, 2 workers {seconds[2]:.2f} s, "
            f"speed-up {seconds[1] / seconds[2]:.2f}x; accuracies equal in-process, on 1 and on 2 workers: {equal}"
        )
    finally:
        ray.shutdown()
    if not equal:
        raise SystemExit("the accuracies differ between the pools")


if __name__ == "__main__":
    main()
