"""The Ray backend: a pool of ``ClientHost`` actors and ``ParamServerShard`` actors.

Per run, the data set is put in the object store once and every host maps it zero-copy. Per round, the global
parameters are put once; each host gets one call with its clients' tasks and that reference, and returns one partial
sum per shard (``num_returns = shards + 1``) which goes straight to the shards without passing through the driver.
Shards reduce the partials in host-id order. rayfl starts a local Ray instance only if none is running and shuts
down only what it started, so it can run inside Tune trials and users' sessions.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import ray

from rayfl.algorithms.base import Algorithm
from rayfl.algorithms.payloads import Aggregate, ClientOutcome, Params, TrainTask
from rayfl.config import BackendConfig, CompressionConfig, ModelConfig
from rayfl.data.federated import FederatedDataset
from rayfl.engine.backend import (
    EvalResult,
    assemble_aggregate,
    combine_eval,
    eval_batches,
    tasks_by_host,
    to_numpy,
)
from rayfl.engine.host import ClientHost
from rayfl.engine.param_server import ParamServerShard, plan_shards

__all__ = ["RayBackend", "ensure_ray"]

log = logging.getLogger(__name__)


def ensure_ray(cfg: BackendConfig) -> bool:
    """Connect to (or start) Ray; returns True when this call started it, so the caller knows to shut it down."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    if cfg.address:
        kwargs["address"] = cfg.address
    else:
        if cfg.num_cpus:
            kwargs["num_cpus"] = cfg.num_cpus
        if cfg.object_store_mb:
            kwargs["object_store_memory"] = cfg.object_store_mb << 20
    ray.init(**kwargs)
    return True


def host_cpu_share(num_hosts: int) -> float:
    """CPUs per host when none are configured: the cluster's CPUs split evenly, at most one each."""
    total = float(ray.cluster_resources().get("CPU", 1.0))
    return min(1.0, math.floor(total / num_hosts * 100) / 100)


def _wait_ready(actors: Sequence[Any], cpus: float, cfg: BackendConfig, timeout_s: float = 120.0) -> None:
    refs = [a.ready.remote() for a in actors]
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        for actor in actors:
            ray.kill(actor)
        raise RuntimeError(
            f"{len(pending)} of {len(refs)} Ray actors did not start within {timeout_s:.0f} s: backend.num_hosts="
            f"{cfg.num_hosts} at {cpus} CPU and {cfg.gpus_per_host} GPU each does not fit the cluster's resources "
            f"{ray.cluster_resources()}; lower backend.cpus_per_host / gpus_per_host or num_hosts"
        )
    ray.get(ready)


class RayBackend:
    """Client hosts and parameter-server shards as Ray actors."""

    def __init__(
        self,
        dataset: FederatedDataset,
        model_cfg: ModelConfig,
        algorithm: Algorithm,
        backend_cfg: BackendConfig,
        shapes: dict[str, tuple[int, ...]],
        eval_batch_size: int,
        init_seed: int,
        compression: CompressionConfig | None = None,
    ) -> None:
        self._started = ensure_ray(backend_cfg)
        self.num_hosts = backend_cfg.num_hosts
        self.num_shards = backend_cfg.num_shards
        self.eval_batch_size = eval_batch_size
        self.num_test = len(dataset.y_test)
        self.sizes = dataset.client_sizes()
        self.shard_of = plan_shards(shapes, self.num_shards)
        dataset_ref = ray.put(dataset)
        cpus = backend_cfg.cpus_per_host or host_cpu_share(self.num_hosts)
        host_cls = ray.remote(ClientHost).options(
            num_cpus=cpus,
            num_gpus=backend_cfg.gpus_per_host,
            max_restarts=0,
            scheduling_strategy="SPREAD",
        )
        self.hosts = [
            host_cls.remote(h, dataset_ref, model_cfg, algorithm, backend_cfg.torch_threads, init_seed, compression)
            for h in range(self.num_hosts)
        ]
        shard_cls = ray.remote(ParamServerShard).options(
            num_cpus=backend_cfg.cpus_per_shard, scheduling_strategy="SPREAD"
        )
        self.shards = [
            shard_cls.remote(s, [n for n, k in self.shard_of.items() if k == s], algorithm.reducer)
            for s in range(self.num_shards)
        ]
        _wait_ready([*self.hosts, *self.shards], cpus, backend_cfg)
        log.info("ray backend: %d client hosts, %d parameter-server shards", self.num_hosts, self.num_shards)

    def train_and_reduce(self, tasks: Sequence[TrainTask], params: Params) -> tuple[Aggregate, list[ClientOutcome]]:
        params_ref = ray.put(to_numpy(params))
        per_shard: list[list[Any]] = [[] for _ in range(self.num_shards)]
        outcome_refs = []
        for host, host_tasks in zip(self.hosts, tasks_by_host(tasks, self.sizes, self.num_hosts), strict=True):
            if not host_tasks:
                continue
            *partial_refs, outcomes_ref = host.run_round.options(num_returns=self.num_shards + 1).remote(
                host_tasks, params_ref, self.shard_of, self.num_shards
            )
            outcome_refs.append(outcomes_ref)
            for s, ref in enumerate(partial_refs):
                per_shard[s].append(ref)
        result_refs = [shard.reduce.remote(params_ref, *per_shard[s]) for s, shard in enumerate(self.shards)]
        outcomes = sorted((o for batch in ray.get(outcome_refs) for o in batch), key=lambda o: o.client_id)
        return assemble_aggregate(ray.get(result_refs), outcomes), outcomes

    def evaluate(self, params: Params, units: tuple[int, ...] | None = None) -> EvalResult:
        params_ref = ray.put(to_numpy(params))
        batches = eval_batches(self.num_test, self.eval_batch_size, self.num_hosts)
        refs = [
            h.evaluate.remote(params_ref, b, self.eval_batch_size, units)
            for h, b in zip(self.hosts, batches, strict=True)
            if b
        ]
        return combine_eval(ray.get(refs))

    def node_ids(self) -> list[str]:
        """The Ray node each client host runs on (for placement checks)."""
        return list(
            ray.get([h.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id()) for h in self.hosts])
        )

    def close(self) -> None:
        for actor in [*self.hosts, *self.shards]:
            ray.kill(actor)
        self.hosts, self.shards = [], []
        if self._started:
            ray.shutdown()
