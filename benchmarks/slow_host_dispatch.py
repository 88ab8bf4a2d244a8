"""What one slow host costs a round, with the static deal and with work-conserving dispatch (issue 45, item 1).

Set-up: the Ray backend with 4 client hosts and 1 shard training FedAvg on the CNN of experiments/fedrescue/cpu.yaml
(16-32-64 channels with batch norm) over synthetic clients of 150 images, ``--clients`` of them per round: all of one
size, so the static deal gives every host the same work and the slow host alone sets its rounds. Host 3 is made
``--slow`` times slower by the test and benchmark hook ``backend.slow_hosts`` (after each client it sleeps for the
extra time). Each mode, ``backend.dispatch: static`` (every host dealt its share up front,
balanced by samples) and ``pull`` (hosts take batches of ``--per-call`` clients as they come free), gets its own pool
and runs a warm-up round (models built, data mapped) and then ``--rounds`` timed rounds of ``train_and_reduce``.
Prints each mode's median round wall time, the clients each host trained in the timed rounds, and whether the two
modes' aggregates are the same bits (they must be: dispatch decides where clients run, never what they compute).

Run: ``python benchmarks/slow_host_dispatch.py [--rounds 3] [--clients 32] [--slow 3] [--per-call 1]``. Hosts get
``--cpus-per-host`` CPUs each (0, the default: the machine's CPUs split over the four hosts). With fewer than four
cores the hosts share them, and the slow host's sleep lends its core to the others, which flatters neither mode more
than the other but makes "three times slower" approximate. Wall-clock figures: compare them within one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
from rayfl.core.messages import Assignment, Params, TrainTask
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.ray.backend import RayBackend, shutdown_ray
from rayfl.engine.sampling import sample_clients
from rayfl.experiment.schema import ExperimentConfig

NUM_HOSTS = 4


def _config(args: argparse.Namespace, dispatch: str) -> ExperimentConfig:
    slow = tuple([1.0] * (NUM_HOSTS - 1) + [args.slow])
    return ExperimentConfig(
        name="slow-host-dispatch",
        clients_per_round=args.clients,
        data=DataConfig(name="synthetic", num_clients=2 * args.clients, synthetic_samples=150, partition="iid"),
        model=CNNConfig(channels=(16, 32, 64), norm="batch"),
        train=TrainConfig(lr=0.05, batch_size=32, eval_batch_size=500),
        backend=BackendConfig(
            kind="ray",
            num_hosts=NUM_HOSTS,
            num_shards=1,
            cpus_per_host=args.cpus_per_host,
            num_cpus=args.num_cpus,
            dispatch=dispatch,  # type: ignore[arg-type]
            clients_per_call=args.per_call,
            slow_hosts=slow,
        ),
    )


def _tasks(cfg: ExperimentConfig, round_idx: int) -> list[TrainTask]:
    clients = sample_clients(cfg.seed, round_idx, cfg.data.num_clients, cfg.clients_per_round)
    return [
        TrainTask(client_id=int(c), round_idx=round_idx, seed=cfg.seed, lr=cfg.train.lr, assignment=Assignment())
        for c in clients
    ]


def _mode(args: argparse.Namespace, dispatch: str) -> tuple[list[float], list[int], list[Params]]:
    """Round wall times, clients per host over the timed rounds, and each timed round's aggregate."""
    cfg = _config(args, dispatch)
    setup = build_setup(cfg)
    backend = build_backend(cfg, setup)
    assert isinstance(backend, RayBackend)
    try:
        backend.train_and_reduce(_tasks(cfg, 0), setup.params)  # warm-up: models built, data mapped
        before = backend.clients_per_host()
        times: list[float] = []
        aggregates: list[Params] = []
        for r in range(1, args.rounds + 1):
            began = time.perf_counter()
            aggregate, _ = backend.train_and_reduce(_tasks(cfg, r), setup.params)
            times.append(time.perf_counter() - began)
            aggregates.append(aggregate.params)
        counts = [a - b for a, b in zip(backend.clients_per_host(), before, strict=True)]
    finally:
        backend.close()
    return times, counts, aggregates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--slow", type=float, default=3.0)
    parser.add_argument("--per-call", type=int, default=1)
    parser.add_argument("--cpus-per-host", type=float, default=0.0)
    parser.add_argument("--num-cpus", type=int, default=0)
    parser.add_argument("--json", default="", help="also write the figures to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    try:
        for dispatch in ("static", "pull"):
            times, counts, aggregates = _mode(args, dispatch)
            results[dispatch] = (times, counts, aggregates)
            print(
                f"{dispatch:>6}: median round {statistics.median(times):.2f} s "
                f"(rounds {', '.join(f'{t:.2f}' for t in times)}); clients per host {counts}"
            )
    finally:
        shutdown_ray()
    static, pulled = results["static"][2], results["pull"][2]
    same = all(torch.equal(a[k], b[k]) for a, b in zip(static, pulled, strict=True) for k in a)
    ratio = statistics.median(results["static"][0]) / statistics.median(results["pull"][0])
    print(f"pull is {ratio:.2f}x faster per round; aggregates bit-identical: {same}")
    if args.json:
        figures = {
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "machine_cpus": os.cpu_count(),
            **{d: {"round_s": [round(t, 3) for t in r[0]], "clients_per_host": r[1]} for d, r in results.items()},
            "speedup": round(ratio, 3),
            "identical": same,
        }
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
