"""What a dead Ray actor costs (``engine/ray/recovery.py``): how long until a SIGKILLed client host or parameter-server
shard has a replacement that answers, and how much longer a round takes when one of its actors was just killed.

Set-up: the Ray backend (2 client hosts, 1 shard, a local Ray with 2 CPUs) training FedAvg on the CNN of
experiments/fedrescue/cpu.yaml (16-32-64 channels with batch norm) over 20 synthetic clients of 100 images, 10 per
round. Each repeat runs, on the same backend: an undisturbed round; a round right after SIGKILL of a client host (the
kill lands while the host is idle, so the round's call meets the dead or restarting actor); the same for the shard;
then SIGKILL of an idle host (and of the shard) followed by one ``ready`` call that Ray retries until the replacement
answers (the restart alone: Ray noticing the death, a worker process, the constructor and its imports). Prints the
medians, and the ``faults`` each disturbed round counted.

Run: ``python benchmarks/actor_restart.py [--repeats 5]``. Wall-clock figures: compare them within one run only.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time
from typing import Any

import ray

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
from rayfl.core.messages import Assignment, Params, TrainTask
from rayfl.engine.build import bind_algorithm, build_backend, build_clock, build_setup
from rayfl.engine.ray.backend import RayBackend
from rayfl.engine.sampling import sample_clients
from rayfl.experiment.schema import ExperimentConfig

CFG = ExperimentConfig(
    name="actor-restart",
    clients_per_round=10,
    data=DataConfig(name="synthetic", num_clients=20, synthetic_samples=100, partition="iid"),
    model=CNNConfig(channels=(16, 32, 64), norm="batch"),
    train=TrainConfig(lr=0.05, batch_size=32, eval_batch_size=500),
    backend=BackendConfig(kind="ray", num_hosts=2, num_shards=1, cpus_per_host=0.5, num_cpus=2),
)


def _pid(actor: Any) -> int:
    return int(ray.get(actor.__ray_call__.remote(lambda _self: os.getpid())))


def _round(backend: RayBackend, params: Params, round_idx: int) -> tuple[Params, float, int]:
    """One round; returns the new parameters, its wall time and the failures it survived."""
    clients = sample_clients(CFG.seed, round_idx, CFG.data.num_clients, CFG.clients_per_round)
    tasks = [
        TrainTask(client_id=int(c), round_idx=round_idx, seed=CFG.seed, lr=CFG.train.lr, assignment=Assignment())
        for c in clients
    ]
    began = time.perf_counter()
    aggregate, _ = backend.train_and_reduce(tasks, params)
    return aggregate.params, time.perf_counter() - began, backend.take_faults()


def _restart_alone(actor: Any) -> float:
    """SIGKILL an idle actor and poll it until its replacement answers."""
    os.kill(_pid(actor), signal.SIGKILL)
    began = time.perf_counter()
    ray.get(actor.ready.options(max_task_retries=-1).remote(), timeout=120)  # Ray retries it until the actor is back
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5)
    ns = parser.parse_args()
    setup = build_setup(CFG)
    bind_algorithm(CFG, setup, build_clock(CFG, setup))
    backend = build_backend(CFG, setup)
    assert isinstance(backend, RayBackend)
    params = setup.params
    times: dict[str, list[float]] = {
        "undisturbed round": [],
        "round after a host kill": [],
        "round after a shard kill": [],
    }
    faults: dict[str, list[int]] = {k: [] for k in times}
    alone: dict[str, list[float]] = {"client host": [], "parameter-server shard": []}
    round_idx = 0
    try:
        params, _, _ = _round(backend, params, round_idx)  # warm-up: every host has built its model
        for repeat in range(ns.repeats):
            for name, victim in (
                ("undisturbed round", None),
                ("round after a host kill", backend.hosts[repeat % len(backend.hosts)]),
                ("round after a shard kill", backend.shards[0]),
            ):
                round_idx += 1
                if victim is not None:
                    os.kill(_pid(victim), signal.SIGKILL)
                params, took, survived = _round(backend, params, round_idx)
                times[name].append(took)
                faults[name].append(survived)
            alone["client host"].append(_restart_alone(backend.hosts[0]))
            alone["parameter-server shard"].append(_restart_alone(backend.shards[0]))
            round_idx += 1
            params, _, _ = _round(backend, params, round_idx)  # the replaced actors work again
    finally:
        backend.close()
    print(f"{ns.repeats} repeats, 2 client hosts, 1 shard, 10 clients per round (medians, wall clock)")
    for name, values in times.items():
        print(f"  {name:<26} {statistics.median(values):6.2f} s   faults counted per round: {faults[name]}")
    for name, values in alone.items():
        print(f"  kill -> {name} replacement answers: {statistics.median(values):6.2f} s ({values})")
    print(f"  recovery's own measure (fault seen -> replacement answers): {backend.recovery.restart_s}")


if __name__ == "__main__":
    main()
