"""Explicit factories from a config to the run's parts: data, initial global parameters, algorithm, clock, backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rayfl.algorithms import Algorithm
from rayfl.algorithms.base import ServerContext
from rayfl.algorithms.payloads import Params
from rayfl.config import ExperimentConfig
from rayfl.config_loader import check_model_input
from rayfl.data.federated import FederatedDataset
from rayfl.engine.backend import Backend, LocalBackend
from rayfl.engine.client_state import initial_weights
from rayfl.engine.phases import build_run_algorithm
from rayfl.models import InputSpec
from rayfl.rng import derive_seed
from rayfl.system.clock import SimClock
from rayfl.system.costs import CostOracle

__all__ = ["Setup", "bind_algorithm", "build_backend", "build_clock", "build_setup", "initial_params"]


@dataclass(frozen=True)
class Setup:
    """Everything a run needs besides its backend."""

    dataset: FederatedDataset
    input_spec: InputSpec
    algorithm: Algorithm
    params: Params


def initial_params(cfg: ExperimentConfig, spec: InputSpec) -> Params:
    """The global model's initial weights, drawn from a generator derived from the seed (global RNG untouched); the
    client hosts rebuild the same weights for local model padding (``client_state.initial_weights``)."""
    return initial_weights(cfg.model, spec, cfg.seed)


def build_setup(cfg: ExperimentConfig, dataset: FederatedDataset | None = None, cache_dir: Path | None = None) -> Setup:
    """Load (or take) the data, build the algorithm and initial parameters; checks config against the data."""
    if dataset is None:
        from rayfl.data import build_federated_dataset

        dataset = build_federated_dataset(cfg.data, cfg.seed, cache_dir)
    if dataset.meta.get("normalize", "dataset") != cfg.data.normalize:
        # the client hosts read it from the data set they are given (``ClientHost._spec_of``)
        dataset = dataclasses.replace(dataset, meta={**dataset.meta, "normalize": cfg.data.normalize})
    if dataset.num_clients < 1:
        raise ValueError(f"data: {cfg.data.name!r} produced no clients")
    check_model_input(cfg, dataset.input_kind)
    spec = InputSpec.of(dataset.input_kind, dataset.num_classes, dataset.x, dataset.meta)
    return Setup(
        dataset=dataset,
        input_spec=spec,
        algorithm=build_run_algorithm(cfg),
        params=initial_params(cfg, spec),
    )


def build_clock(cfg: ExperimentConfig, setup: Setup) -> SimClock:
    """The simulated clock with its resource sources and the cost oracle for this model and training set-up."""
    shapes = {k: tuple(v.shape) for k, v in setup.params.items()}
    overhead = cfg.system.memory_overhead_mib * 2.0**20  # the need the clock checks includes the runtime overhead
    oracle = CostOracle(
        cfg.model, setup.input_spec, cfg.train, shapes, overhead_bytes=overhead, compression=cfg.compression
    )
    return SimClock(cfg.system, cfg.train, cfg.seed, oracle)


def bind_algorithm(cfg: ExperimentConfig, setup: Setup, clock: SimClock) -> None:
    """Give the algorithm's server side the run's family, cost model (the clock's) and data set."""
    setup.algorithm.bind_server(
        ServerContext(
            seed=cfg.seed,
            rounds=cfg.rounds,
            clients_per_round=cfg.clients_per_round,
            input_spec=setup.input_spec,
            family=clock.oracle.family,
            cost=clock.oracle.elastic,
            dataset=setup.dataset,
            model=cfg.model,
            compute_flops_per_s=clock.compute.at(np.arange(setup.dataset.num_clients), 0.0, 0),
        )
    )


def _ray_backend(**kwargs: Any) -> Backend:
    from rayfl.engine.ray_backend import RayBackend  # imports Ray only when asked for

    return RayBackend(**kwargs)


_BACKENDS: dict[str, Callable[..., Backend]] = {"local": LocalBackend, "ray": _ray_backend}


def build_backend(cfg: ExperimentConfig, setup: Setup) -> Backend:
    """The backend named by ``backend.kind``."""
    return _BACKENDS[cfg.backend.kind](
        dataset=setup.dataset,
        model_cfg=cfg.model,
        algorithm=setup.algorithm,
        backend_cfg=cfg.backend,
        shapes={k: tuple(v.shape) for k, v in setup.params.items()},
        eval_batch_size=cfg.train.eval_batch_size,
        init_seed=derive_seed(cfg.seed, "host-template"),
        compression=cfg.compression,
    )
