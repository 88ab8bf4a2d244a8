"""Engine overhead: rayfl's wall time against the bare training compute it orchestrates.

Workload (fixed): 1,000 synthetic clients with 64 32x32 images each, 20 clients per round, 1 local epoch,
batch 32, a small CNN (channels 16-32-64), FedAvg. For each backend it prints

* client updates per second, steady state (rounds after the first two) and end to end (start-up included);
* the ratio of wall time to the pure local-training compute: the same training loop (copy weights into a model,
  1 epoch of SGD on the client's 64 samples) timed in a plain Python loop with no framework around it, one thread.
  For a backend that trains on H hosts in parallel the pure time is divided by H (ideal parallel speed-up), so the
  ratio charges the backend for any imbalance as well as for its own overhead.

Run: ``python benchmarks/engine_overhead.py [--rounds 12] [--hosts 2]``
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
from rayfl.core.messages import Assignment, TrainTask
from rayfl.data import build_federated_dataset
from rayfl.engine.build import build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.sampling import sample_clients
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.client import ClientContext
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.registry import build_algorithm
from rayfl.models import InputSpec, build_model


def workload(rounds: int, kind: str, hosts: int) -> ExperimentConfig:
    return ExperimentConfig(
        name=f"overhead-{kind}",
        rounds=rounds,
        clients_per_round=20,
        eval_every=10_000,  # evaluation only after the last round; it is not training compute
        data=DataConfig(name="synthetic", partition="iid", num_clients=1000, synthetic_samples=64),
        model=CNNConfig(channels=(16, 32, 64)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=32, lr=0.05, optimizer="sgd"),
        backend=BackendConfig(kind=kind, num_hosts=hosts, num_cpus=hosts),  # type: ignore[arg-type]
    )


def pure_compute(cfg: ExperimentConfig, rounds: int, part: int = 0, parts: int = 1) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of the bare training loop for the same clients, one thread, no
    framework: per client, copy the global weights into a model and train one epoch (its data is fetched outside
    the timing).

    With ``parts > 1`` only every ``parts``-th sampled client (offset ``part``) is trained, so that ``parts`` copies
    running side by side cover the round between them.
    """
    torch.set_num_threads(1)
    setup = build_setup(cfg)
    ds = setup.dataset
    spec = InputSpec.of(ds.input_kind, ds.num_classes, ds.x, ds.meta)
    algo = build_algorithm(cfg.algorithm, cfg.train)
    model = build_model(cfg.model, spec)
    params = setup.params
    wall = cpu = 0.0
    for round_idx in range(-1, rounds):  # round -1 warms up and is not counted
        for cid in sample_clients(cfg.seed, max(round_idx, 0), ds.num_clients, cfg.clients_per_round)[part::parts]:
            x, y = ds.client_train(int(cid))
            start, start_cpu = time.perf_counter(), time.process_time()
            with torch.no_grad():
                for name, tensor in model.state_dict().items():
                    tensor.copy_(params[name])
            task = TrainTask(
                client_id=int(cid), round_idx=max(round_idx, 0), seed=cfg.seed, lr=cfg.train.lr, assignment=Assignment()
            )
            algo.local_train(ClientContext.of(task, model, spec), x, y)
            if round_idx >= 0:
                wall += time.perf_counter() - start
                cpu += time.process_time() - start_cpu
    return wall, cpu


def pure_compute_s(cfg: ExperimentConfig, rounds: int, part: int = 0, parts: int = 1) -> float:
    """Wall seconds of the bare training loop (``pure_compute``)."""
    return pure_compute(cfg, rounds, part, parts)[0]


def pure_in_ray_workers_s(cfg: ExperimentConfig, rounds: int, hosts: int) -> float:
    """Per-round seconds of the bare loop split over ``hosts`` concurrent Ray worker processes (no rayfl engine).

    This is the floor any Ray-based engine can reach on this machine: it includes what running inside Ray workers
    costs the kernels themselves (Ray's own processes and threads share the same cores), but none of rayfl's work.
    """
    import ray

    from rayfl.engine.ray.backend import ensure_ray

    owned = ensure_ray(cfg.backend)
    try:
        work = ray.remote(num_cpus=1)(pure_compute_s)
        return max(ray.get([work.remote(cfg, rounds, h, hosts) for h in range(hosts)])) / rounds
    finally:
        if owned:
            ray.shutdown()


def measure(kind: str, rounds: int, hosts: int, pure_per_round: float, floor: float | None = None) -> None:
    cfg = workload(rounds, kind, hosts)
    start = time.perf_counter()
    result = run_experiment(cfg, write=False)
    end_to_end = time.perf_counter() - start
    steady = result.records[2:-1]  # skip warm-up rounds and the final (evaluated) round
    steady_s = sum(r.round_wall_s for r in steady)
    updates = cfg.clients_per_round
    parallel = hosts if kind == "ray" else 1
    ideal = pure_per_round / parallel
    print(
        f"{kind:>5} backend, {hosts} host(s): steady {updates * len(steady) / steady_s:7.1f} updates/s, "
        f"{steady_s / len(steady):.3f} s/round, ratio to pure compute {steady_s / len(steady) / ideal:.3f} | "
        f"end to end {updates * rounds / end_to_end:6.1f} updates/s, {end_to_end:.1f} s, "
        f"ratio {end_to_end / (ideal * rounds):.3f}"
    )
    if floor is not None:
        print(
            f"      bare loop in {hosts} concurrent Ray workers: {floor:.3f} s/round "
            f"(ratio {floor / ideal:.3f} to ideal pure); rayfl steady over that floor: "
            f"{steady_s / len(steady) / floor:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--hosts", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cfg = workload(args.rounds, "local", 1)
    build_federated_dataset(cfg.data, cfg.seed)  # warm caches so that neither side pays for data generation
    pure = pure_compute_s(cfg, args.rounds) / args.rounds
    print(
        f"pure local-training compute: {pure:.3f} s per round of {cfg.clients_per_round} clients "
        f"({cfg.clients_per_round / pure:.1f} updates/s on one thread)"
    )
    measure("local", args.rounds, 1, pure)
    ray_cfg = workload(args.rounds, "ray", args.hosts)
    floor = pure_in_ray_workers_s(ray_cfg, args.rounds, args.hosts)
    measure("ray", args.rounds, args.hosts, pure, floor)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
