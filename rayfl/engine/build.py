"""Explicit factories from a config to the run's parts: data, initial global parameters, algorithm, clock, backend.

Start-up (``prepare_run``): with the Ray backend, Ray starts (or is reused) in the main thread while the data set,
algorithm and initial model are built in a second thread, and as soon as Ray is up the client hosts and shards are
created (``ray_pool.take_pool``; a warm pool of the last run is taken instead), so their processes start and import
torch while the data is still being prepared. The data set is then put in the object store once (samples mapped from
files as the files' paths when every node sees them: ``data.ship``, ``engine/ray/data_ship.py``), and the driver
keeps the object store's zero-copy view of it instead of its own copy (``Setup.dataset_ref`` is what the hosts
receive, with ``Setup.pool`` in ``build_backend``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayfl.config.sections import BackendConfig
from rayfl.core.messages import Params
from rayfl.core.rng import derive_seed
from rayfl.data.federated import FederatedDataset
from rayfl.engine.exec.backend import Backend, LocalBackend
from rayfl.engine.exec.client_state import initial_weights
from rayfl.engine.phases import build_run_algorithm
from rayfl.engine.preflight import check_custom_model, check_distill_device
from rayfl.experiment.loader import check_model_input
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.algorithm import Algorithm, ServerContext
from rayfl.fl.api.tasks import LocalTaskPool, TaskPool
from rayfl.models import InputSpec
from rayfl.system.clock import SimClock
from rayfl.system.costs import CostOracle

__all__ = ["Setup", "bind_algorithm", "build_backend", "build_clock", "build_setup", "initial_params", "prepare_run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setup:
    """Everything a run needs besides its backend."""

    dataset: FederatedDataset
    input_spec: InputSpec
    algorithm: Algorithm
    params: Params
    dataset_ref: Any = None  # the data set's Ray object reference once it is in the object store (``prepare_run``)
    pool: Any = field(default=None, compare=False)  # the Ray backend's actors, started by ``prepare_run``
    # wall seconds of the start-up steps (``prepare_run``): ray_start_s, setup_s (data, algorithm, model), put_s
    startup_s: dict[str, float] = field(default_factory=dict, compare=False)


def initial_params(cfg: ExperimentConfig, spec: InputSpec) -> Params:
    """The global model's initial weights, drawn from a generator derived from the seed (global RNG untouched)."""
    return initial_weights(cfg.model, spec, cfg.seed)


def build_setup(cfg: ExperimentConfig, dataset: FederatedDataset | None = None, cache_dir: Path | None = None) -> Setup:
    """Load (or take) the data, build the algorithm and initial parameters; checks config against the data."""
    from rayfl.data import build_federated_dataset, with_validation

    if dataset is None:
        dataset = build_federated_dataset(cfg.data, cfg.data_seed, cache_dir)
    dataset = with_validation(dataset, cfg.data, cfg.data_seed)  # a given data set gets data.val_fraction's split too
    if dataset.meta.get("normalize", "dataset") != cfg.data.normalize:
        # the client hosts read it from the data set they are given (``ClientHost._spec_of``)
        dataset = dataclasses.replace(dataset, meta={**dataset.meta, "normalize": cfg.data.normalize})
    if dataset.num_clients < 1:
        raise ValueError(f"data: {cfg.data.name!r} produced no clients")
    check_model_input(cfg, dataset.input_kind)
    check_custom_model(cfg, dataset.input_kind)  # custom data: its kind of input is known only now
    check_distill_device(cfg)
    spec = InputSpec.of(dataset.input_kind, dataset.num_classes, dataset.x, dataset.meta)
    return Setup(
        dataset=dataset,
        input_spec=spec,
        algorithm=build_run_algorithm(cfg),
        params=initial_params(cfg, spec),
    )


def prepare_run(cfg: ExperimentConfig, dataset: FederatedDataset | None = None, cache_dir: Path | None = None) -> Setup:
    """``build_setup``, and for ``backend.kind: ray`` Ray started (or reused) meanwhile and the data set placed in the
    object store, the driver keeping only the store's view of it (see the module docstring). ``backend.kind`` is
    resolved already (``engine/startup.py``)."""
    if _backend_kind(cfg) != "ray":
        began = time.perf_counter()
        setup = build_setup(cfg, dataset, cache_dir)
        return dataclasses.replace(setup, startup_s={"setup_s": time.perf_counter() - began})
    from rayfl.data.blas_threads import one_blas_thread
    from rayfl.engine.ray.backend import ensure_ray, share
    from rayfl.engine.ray.pool import take_pool

    timed: dict[str, float] = {}

    def build() -> Setup:
        began = time.perf_counter()
        try:
            return build_setup(cfg, dataset, cache_dir)
        finally:
            timed["setup_s"] = time.perf_counter() - began

    # numpy's BLAS at one thread while ``ray.init`` forks beside the set-up (``rayfl/data/blas_threads.py``)
    with one_blas_thread(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="rayfl-setup") as threads:
        building = threads.submit(build)
        began = time.perf_counter()
        ensure_ray(cfg.backend)  # in the main thread: Ray's driver sets signal handlers
        timed["ray_start_s"] = time.perf_counter() - began
        began = time.perf_counter()
        try:
            actors = take_pool(cfg.backend)  # created now: they start while the data is still being prepared
        except BaseException:
            building.cancel()
            raise
        timed["pool_s"] = time.perf_counter() - began
        try:
            setup = building.result()  # a data error surfaces here, after Ray is up (which stays for the next run)
        except BaseException:
            actors.release()
            raise
    began = time.perf_counter()
    try:
        ref, view = share(setup.dataset, cfg.data.ship)  # memory-mapped files by path where every node sees them
    except BaseException:
        actors.release()
        raise
    timed["put_s"] = time.perf_counter() - began
    log.debug("start-up: %s", {k: round(v, 3) for k, v in timed.items()})
    return dataclasses.replace(setup, dataset=view, dataset_ref=ref, pool=actors, startup_s=timed)


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
            oracle=clock.oracle,
            eval_widths=cfg.eval_widths,
            compute_flops_per_s_of=functools.partial(clock.compute.at, t=0.0, round_idx=0),
        )
    )


def _local_backend(setup: Setup, **kwargs: Any) -> Backend:
    return LocalBackend(**kwargs)


def _ray_backend(setup: Setup, **kwargs: Any) -> Backend:
    from rayfl.engine.ray.backend import RayBackend  # imports Ray only when asked for

    return RayBackend(dataset_ref=setup.dataset_ref, pool=setup.pool, **kwargs)


def _backend_kind(cfg: ExperimentConfig) -> str:
    """``backend.kind`` as start-up resolved it: ``auto`` is decided once, by ``startup.plan_start`` (or
    ``backend_choice.resolve_backend`` for a caller that builds parts itself), never again by a factory."""
    if cfg.backend.kind == "auto":
        raise ValueError(
            "backend.kind 'auto' reached a factory unresolved: resolve it first with "
            "rayfl.engine.backend_choice.resolve_backend(cfg) (start-up does, in rayfl.engine.startup.plan_start)"
        )
    return cfg.backend.kind


_BACKENDS: dict[str, Callable[..., Backend]] = {"local": _local_backend, "ray": _ray_backend}


def build_backend(cfg: ExperimentConfig, setup: Setup) -> Backend:
    """The backend named by ``backend.kind``, resolved already (``engine/startup.py``)."""
    return _BACKENDS[_backend_kind(cfg)](
        setup,
        dataset=setup.dataset,
        model_cfg=cfg.model,
        algorithm=setup.algorithm,
        backend_cfg=cfg.backend,
        shapes={k: tuple(v.shape) for k, v in setup.params.items()},
        eval_batch_size=cfg.train.eval_batch_size,
        init_seed=derive_seed(cfg.seed, "host-template"),
        compression=cfg.compression,
    )


def build_task_pool(cfg: BackendConfig) -> TaskPool:
    """The pool for server-side work (FedorAS's search) matching the backend: Ray tasks on the Ray backend, in-process
    otherwise."""
    if cfg.kind == "ray":
        from rayfl.engine.ray.server_tasks import RayTaskPool

        return RayTaskPool(cfg.head)
    return LocalTaskPool()
