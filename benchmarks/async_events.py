"""Simulated events per second of an asynchronous run (issue 27): ``N`` clients, ``C`` in flight, FedBuff steps
every ``B`` arrivals, a tiny CNN with ``train.noop`` (the clients return what they received: the engine's own cost,
training aside) or real training (``--train``).

An event is one client start (sampling, check-in at its own simulated time, assignment, the clock's plan from its
traces) or one arrival (taken in time order, its update rebased and aggregated). Printed: events, wall seconds of
the steps, events per second, and the share of the wall spent in the hosts' training calls (``train_wall_s``), so
the event simulation's own rate is ``events / (wall - train)`` too (``train_wall_s``: the policy's training calls,
timed around ``BufferedRounds._train``: the backend's training of every client that started on a version, and
keeping each upload with its start version's values).

    python benchmarks/async_events.py                        # N=10,000, C=1,000, B=100, 20 steps, in-process
    python benchmarks/async_events.py --n 100000 --c 1000 --steps 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, DataConfig, ResourceConfig, ServerConfig, SystemConfig, TrainConfig
from rayfl.engine.driver import run_experiment
from rayfl.engine.policies.buffered import BufferedRounds
from rayfl.experiment.schema import ExperimentConfig


def config(n: int, c: int, b: int, steps: int, train: bool, policy: str) -> ExperimentConfig:
    return ExperimentConfig(
        name="async-events",
        rounds=steps,
        clients_per_round=c,
        eval_every=steps,
        data=DataConfig(
            name="synthetic", partition="iid", num_clients=n, synthetic_samples=8, synthetic_labels="image"
        ),
        model=CNNConfig(channels=(4, 8)),
        train=TrainConfig(lr=0.05, batch_size=8, noop=not train),
        backend=BackendConfig(kind="local", num_hosts=1),
        system=SystemConfig(
            compute=ResourceConfig(source="uniform", low=0.001, high=0.01, per_round=False),
            bandwidth_down=ResourceConfig(source="uniform", low=1.0, high=20.0),
            memory=ResourceConfig(source="uniform", low=64.0, high=4096.0),
        ),
        server=ServerConfig(policy=policy, concurrency=c, buffer_size=b if policy == "fedbuff" else 0),  # type: ignore[arg-type]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--c", type=int, default=1_000)
    parser.add_argument("--b", type=int, default=100)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--policy", choices=["fedbuff", "fedasync"], default="fedbuff")
    parser.add_argument("--train", action="store_true", help="train for real instead of train.noop")
    args = parser.parse_args()
    cfg = config(args.n, args.c, args.b, args.steps, args.train, args.policy)
    spent = [0.0]
    train = BufferedRounds._train

    def timed(self: BufferedRounds, *a: object) -> None:  # the training calls' wall, apart from the events'
        t0 = time.perf_counter()
        train(self, *a)  # type: ignore[arg-type]
        spent[0] += time.perf_counter() - t0

    BufferedRounds._train = timed  # type: ignore[method-assign]
    began = time.perf_counter()
    result = run_experiment(cfg, write=False)
    total = time.perf_counter() - began
    records = result.records
    arrivals = sum(r.clients_sampled for r in records)
    starts = arrivals + records[-1].in_flight  # every client that arrived, and those still in flight, started
    steps_wall = sum(r.round_wall_s for r in records) - sum(r.eval_wall_s for r in records)
    train_wall = spent[0]
    out = {
        "n": args.n,
        "c": args.c,
        "b": args.b if args.policy == "fedbuff" else 1,
        "policy": args.policy,
        "train": args.train,
        "steps": len(records),
        "events": starts + arrivals,
        "starts": starts,
        "arrivals": arrivals,
        "failed": sum(r.clients_failed for r in records),
        "steps_wall_s": round(steps_wall, 3),
        "train_wall_s": round(train_wall, 3),
        "events_per_s": round((starts + arrivals) / steps_wall, 1),
        "events_per_s_without_training": round((starts + arrivals) / max(1e-9, steps_wall - train_wall), 1),
        "sim_hours": round(records[-1].sim_time_s / 3600.0, 3),
        "process_wall_s": round(total, 2),
    }
    print(json.dumps(out, indent=1))
    print(dataclasses.asdict(records[-1])["staleness_mean"], "mean staleness in the last step")


if __name__ == "__main__":
    main()
