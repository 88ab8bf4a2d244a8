"""What TensorBoard and MLflow tracking (``rayfl/engine/persist/tracking.py``) cost a run per round.

Two figures per setting (off, tensorboard, mlflow, both):

* ``log_round_ms``: the trackers' own time per round, timed around ``Trackers.log_round`` on the records of a real
  run (every numeric record field, two models' accuracies, one further evaluation), over ``--rounds`` rounds;
* ``close_ms``: writing the config as hyperparameters at the end (once per run);
* ``run_s`` / ``per_round_ms``: the whole written run end to end (in-process backend, the scale benchmark's CNN on
  synthetic images, ``--clients`` per round), and its difference from the run without tracking per round (noisy on a
  shared machine: the timed figure above is the one to read).

``python benchmarks/tracking_overhead.py --rounds 30`` prints a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

SETTINGS = {
    "off": {"tensorboard": False, "mlflow": False},
    "tensorboard": {"tensorboard": True, "mlflow": False},
    "mlflow": {"tensorboard": False, "mlflow": True},
    "both": {"tensorboard": True, "mlflow": True},
}


def workload(rounds: int, clients: int, out: Path, tracking: dict[str, bool]) -> Any:
    from rayfl.config.model import CNNConfig
    from rayfl.config.sections import BackendConfig, DataConfig, TrackingConfig, TrainConfig
    from rayfl.experiment.schema import ExperimentConfig
    from rayfl.fl.methods.independent.config import IndependentConfig

    return ExperimentConfig(
        name="tracking",
        rounds=rounds,
        clients_per_round=clients,
        output_dir=str(out),
        data=DataConfig(name="synthetic", partition="iid", num_clients=100, synthetic_samples=64),
        model=CNNConfig(channels=(16, 32)),
        algorithm=IndependentConfig(num_models=2),
        train=TrainConfig(epochs=1, batch_size=32, lr=0.05, optimizer="sgd"),
        backend=BackendConfig(kind="local", num_hosts=2),
        tracking=TrackingConfig(**tracking),
    )


def measure(setting: str, rounds: int, clients: int, base: Path) -> dict[str, float]:
    from rayfl.engine.driver import run_experiment
    from rayfl.engine.persist import tracking

    spent = {"log": 0.0, "close": 0.0}
    original_log, original_close = tracking.Trackers.log_round, tracking.Trackers.close

    def timed_log(self: Any, record: Any, evals: Any) -> None:
        began = time.perf_counter()
        original_log(self, record, evals)
        spent["log"] += time.perf_counter() - began

    def timed_close(self: Any, summary: Any) -> None:
        began = time.perf_counter()
        original_close(self, summary)
        spent["close"] += time.perf_counter() - began

    cfg = workload(rounds, clients, base / setting, SETTINGS[setting])
    tracking.Trackers.log_round = timed_log  # type: ignore[method-assign]
    tracking.Trackers.close = timed_close  # type: ignore[method-assign]
    try:
        began = time.perf_counter()
        run_experiment(dataclasses.replace(cfg))
        run_s = time.perf_counter() - began
    finally:
        tracking.Trackers.log_round = original_log  # type: ignore[method-assign]
        tracking.Trackers.close = original_close  # type: ignore[method-assign]
    return {
        "log_round_ms": 1000 * spent["log"] / rounds,
        "close_ms": 1000 * spent["close"],
        "run_s": run_s,
        "per_round_ms": 1000 * run_s / rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        measure("off", 2, args.clients, Path(tmp) / "warm")  # imports and caches warm before anything is timed
        rows = {s: measure(s, args.rounds, args.clients, Path(tmp)) for s in SETTINGS}
    off = rows["off"]["per_round_ms"]
    print(f"{args.rounds} rounds, {args.clients} clients per round, in-process\n")
    print("| tracking | log_round ms/round | close ms (once) | run s | ms/round | vs off ms/round |")
    print("| --- | --- | --- | --- | --- | --- |")
    for setting, r in rows.items():
        print(
            f"| {setting} | {r['log_round_ms']:.2f} | {r['close_ms']:.0f} | {r['run_s']:.2f} | "
            f"{r['per_round_ms']:.0f} | {r['per_round_ms'] - off:+.0f} |"
        )


if __name__ == "__main__":
    main()
