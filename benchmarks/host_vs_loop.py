"""A client host's CPU per update against the bare training loop's, in one process, alternating round by round.

Both train the same clients (scale.py's workload: synthetic 3x32x32 images, 64 per client, one epoch of batch 32
SGD on a two-conv CNN) on one thread: the host through ``ClientHost.run_round`` (its data made on demand, the weights
loaded, the seeded generators, the update checked, pre-aggregated and split for the shards), the loop as
``engine_overhead.pure_compute`` does it (weights copied in, ``local_train``; the client's data fetched outside the
timing). Rounds alternate which goes first, so that the machine's load weighs on both alike; the median of the
per-round ratios is the host's own cost over the loop, without Ray and without a second training beside it.

Run: ``python benchmarks/host_vs_loop.py [--rounds 12] [--clients 20]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
from rayfl.core.messages import Assignment, TrainTask
from rayfl.engine.build import build_setup
from rayfl.engine.exec.allocator import tune_allocator
from rayfl.engine.exec.backend import to_numpy
from rayfl.engine.exec.host import ClientHost
from rayfl.engine.exec.param_server import plan_shards
from rayfl.engine.sampling import sample_clients
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.client import ClientContext
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.registry import build_algorithm
from rayfl.models import InputSpec, build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--clients", type=int, default=20)
    args = parser.parse_args()
    k = args.clients
    cfg = ExperimentConfig(
        name="host-vs-loop",
        rounds=args.rounds + 1,
        clients_per_round=k,
        data=DataConfig(name="synthetic", partition="iid", num_clients=1000, synthetic_samples=64),
        model=CNNConfig(channels=(16, 32)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=32, lr=0.05, optimizer="sgd"),
        backend=BackendConfig(kind="local", num_hosts=1, num_cpus=1),
    )
    tune_allocator()  # as in a client host, for both sides
    torch.set_num_threads(1)
    setup = build_setup(cfg)
    ds, params = setup.dataset, setup.params
    host = ClientHost(0, ds, cfg.model, build_algorithm(cfg.algorithm, cfg.train), cfg.backend, cfg.seed)
    spec = InputSpec.of(ds.input_kind, ds.num_classes, ds.x, ds.meta)
    loop_algo = build_algorithm(cfg.algorithm, cfg.train)
    model = build_model(cfg.model, spec)
    arrays = to_numpy(params)
    shard_of = plan_shards({k: tuple(v.shape) for k, v in params.items()}, 1)

    def tasks(round_idx: int) -> list[TrainTask]:
        ids = sample_clients(cfg.seed, round_idx, ds.num_clients, k)
        return [
            TrainTask(client_id=int(c), round_idx=round_idx, seed=cfg.seed, lr=cfg.train.lr, assignment=Assignment())
            for c in ids
        ]

    def hosted(round_idx: int) -> float:
        began = time.thread_time()
        host.run_round(tasks(round_idx), arrays, shard_of, 1)
        return time.thread_time() - began

    def bare(round_idx: int) -> float:
        spent = 0.0
        for task in tasks(round_idx):
            x, y = ds.client_train(task.client_id)
            began = time.thread_time()
            with torch.no_grad():
                for name, tensor in model.state_dict().items():
                    tensor.copy_(params[name])
            loop_algo.local_train(ClientContext.of(task, model, spec), x, y)
            spent += time.thread_time() - began
        return spent

    hosted(0), bare(0)  # warm-up
    host_ms, loop_ms = [], []
    for round_idx in range(1, args.rounds + 1):
        if round_idx % 2:
            h, b = hosted(round_idx), bare(round_idx)
        else:
            b, h = bare(round_idx), hosted(round_idx)
        host_ms.append(1000 * h / k)
        loop_ms.append(1000 * b / k)
    ratios = np.array(host_ms) / np.array(loop_ms)
    print(
        f"CPU per update over {args.rounds} rounds of {k}: host {np.mean(host_ms):.2f} ms, bare loop "
        f"{np.mean(loop_ms):.2f} ms; host / loop per round: median {np.median(ratios):.3f} "
        f"(min {ratios.min():.3f}, max {ratios.max():.3f})"
    )


if __name__ == "__main__":
    main()
