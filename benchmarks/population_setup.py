"""Issue 30's per-client work that is still O(population), timed against N (the tests count it; this prints seconds).

For each N (synthetic clients of 64 images, labels per image, a two-conv CNN, FedAvg):

* ``dirichlet_pool_s`` / ``dirichlet_counts_s``: loading a Dirichlet split (``data.dirichlet_split: pool``, the
  default, labels every image; ``counts`` draws label counts only); ``counts_client_s``: one client's rows under
  ``counts`` (found by label when it trains); the pool split is skipped above ``--pool-max``
  (10,000);
* ``census_s``: one evaluated round's census of every client, as a multi-model run, an overridden ``device_evals``,
  ``eval_all_devices`` or per-client test sets pay it (``steps.evaluate_round``): every client's budgets checked in
  and the default ``device_evals`` over them (a lower bound: a method's own ``client_model`` may cost more);
* ``val_split_s``: ``data.val_fraction: 0.1``'s split (``hold_out_validation``: one permutation per client, drawn
  in client order);
* ``nobody_s``: the pre-flight check when nobody can train (a 1 MiB memory budget: every client of 16 round starts
  looked at before the one-line refusal), up to ``--nobody-max``; when some client can, it stops at its first chunk
  of 512, whatever N.

``python benchmarks/population_setup.py --n 10000 100000 1000000``
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, DataConfig, ResourceConfig, SystemConfig, TrainConfig
from rayfl.core.rng import derive_rng
from rayfl.data.federated import hold_out_validation
from rayfl.data.synthetic import load_synthetic
from rayfl.engine.build import build_clock, build_setup
from rayfl.engine.preflight import nobody_can_train_problem
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.fedavg.config import FedAvgConfig


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    out = fn()
    return time.perf_counter() - began, out


def _config(n: int, memory_mib: float | None = None) -> ExperimentConfig:
    system = SystemConfig() if memory_mib is None else SystemConfig(memory=ResourceConfig(source="constant", low=1.0))
    return ExperimentConfig(
        name="population",
        rounds=100,
        clients_per_round=10,
        data=DataConfig(
            name="synthetic", partition="iid", num_clients=n, synthetic_samples=64, synthetic_labels="image"
        ),
        model=CNNConfig(channels=(4, 8)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=32, lr=0.05),
        backend=BackendConfig(kind="local", num_hosts=1),
        system=system,
    )


def point(n: int, pool_max: int, nobody_max: int) -> dict[str, float]:
    out: dict[str, float] = {"n": n}
    split = DataConfig(name="synthetic", partition="dirichlet", num_clients=n, synthetic_samples=64)
    if n <= pool_max:
        out["dirichlet_pool_s"] = _timed(lambda: load_synthetic(split, 0))[0]
    counts_cfg = DataConfig(**{**split.__dict__, "dirichlet_split": "counts"})
    out["dirichlet_counts_s"], counted = _timed(lambda: load_synthetic(counts_cfg, 0))
    out["counts_client_s"] = _timed(lambda: counted.client_train(n - 1))[0]
    cfg = _config(n)
    setup = build_setup(cfg)
    clock = build_clock(cfg, setup)
    state = setup.algorithm.init_state(setup.params)
    everyone = np.arange(n)

    def census() -> int:
        views = clock.check_in(0, everyone, setup.dataset.client_sizes().tolist())
        return len(setup.algorithm.device_evals(state, views))

    out["census_s"] = _timed(census)[0]
    out["val_split_s"] = _timed(lambda: hold_out_validation(setup.dataset, 0.1, derive_rng(0, "validation")))[0]
    if n <= nobody_max:
        tight = _config(n, memory_mib=1.0)
        tight_setup = build_setup(tight)
        tight_clock = build_clock(tight, tight_setup)
        out["nobody_s"], reason = _timed(lambda: nobody_can_train_problem(tight, tight_setup, tight_clock))
        assert reason, "the 1 MiB budget was meant to refuse every client"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--pool-max", type=int, default=10_000, help="largest N for the pool split (it labels all)")
    parser.add_argument("--nobody-max", type=int, default=1_000_000, help="largest N for the refusing pre-flight check")
    args = parser.parse_args()
    for n in args.n:
        print(json.dumps({k: round(v, 3) for k, v in point(n, args.pool_max, args.nobody_max).items()}), flush=True)


if __name__ == "__main__":
    main()
