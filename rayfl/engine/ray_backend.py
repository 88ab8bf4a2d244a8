"""The Ray backend: a pool of ``ClientHost`` actors and ``ParamServerShard`` actors.

Per run, the data set is put in the object store once and every host maps it zero-copy. Per round, the global
parameters are put once; each host gets one call with its clients' tasks and that reference, and returns one partial
sum per shard (``num_returns = shards + 1``) which goes straight to the shards without passing through the driver.
Shards reduce the partials in host-id order. rayfl starts a local Ray instance only if none is running, reuses a
running one for later runs in the process, and shuts down only what it started (``shutdown_ray``), so it can run
inside Tune trials and users' sessions. Where the actors go (a Tune trial's placement group, spread over the
cluster's nodes, or packed) is decided in ``placement.py``. A host or shard that dies is restarted by Ray and its lost
work re-run by the driver (``recovery.py``).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import ray

from rayfl.algorithms.base import Algorithm
from rayfl.algorithms.payloads import Aggregate, ClientOutcome, Params, TrainTask
from rayfl.config import BackendConfig, CompressionConfig, ModelConfig
from rayfl.config_loader import ConfigError
from rayfl.data.federated import FederatedDataset
from rayfl.engine.backend import (
    EvalResult,
    assemble_aggregate,
    combine_eval,
    eval_batches,
    shard_plan,
    tasks_by_host,
    to_numpy,
)
from rayfl.engine.client_state import ClientStateStore, keeps_state
from rayfl.engine.host import ClientHost, EvalStats
from rayfl.engine.param_server import ParamServerShard, plan_shards
from rayfl.engine.placement import ActorSlot, PoolLayout, layout_in_group, pack_layout, spread_layout
from rayfl.engine.recovery import InputsLost, Recovery, Step

__all__ = ["RayBackend", "ensure_ray", "share", "shutdown_ray"]

log = logging.getLogger(__name__)


_started_gcs: str | None = None  # the GCS address of the Ray instance rayfl started in this process, if any


def _gcs_address() -> str:
    return str(ray.get_runtime_context().gcs_address)


def ensure_ray(cfg: BackendConfig) -> bool:
    """Connect to (or start) Ray; returns True when this call started it.

    A running Ray is reused, whoever started it: runs in one process (a sweep's trials, a notebook calling
    ``run_experiment`` twice) pay Ray's start once. Backends never shut Ray down; one rayfl started stays up until
    ``shutdown_ray`` or the end of the process (Ray's own exit hook), and one rayfl did not start is never shut down.
    """
    global _started_gcs
    if cfg.address:  # an address named in the config must answer, even when some Ray is connected already
        _probe_address(cfg.address, cfg.start_timeout_s)
    if ray.is_initialized():
        log.debug("reusing the running Ray instance (backend.num_cpus and object_store_mb apply to a new one only)")
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
    _started_gcs = None if cfg.address else _gcs_address()
    return True


def shutdown_ray() -> bool:
    """Shut down the Ray instance rayfl started in this process, if it still runs; returns whether it did. A Ray
    instance rayfl connected to but did not start is left alone."""
    global _started_gcs
    if _started_gcs is None or not ray.is_initialized() or _gcs_address() != _started_gcs:
        return False
    ray.shutdown()
    _started_gcs = None
    return True


def share(dataset: FederatedDataset) -> tuple[Any, FederatedDataset]:
    """Put ``dataset`` in the object store; returns its reference and the store's zero-copy view of it, which the
    caller keeps instead of its own copy (read-only arrays, shared with the hosts on this node)."""
    ref = ray.put(dataset)
    return ref, ray.get(ref)


def _probe_address(address: str, timeout_s: float) -> None:
    """Fail within ``timeout_s`` when nothing listens at a ``host:port`` cluster address: ``ray.init`` itself keeps
    retrying an unreachable GCS for many minutes. ``auto`` (and addresses without a port) go to Ray as they are."""
    host, sep, port_text = address.removeprefix("ray://").rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host.strip("[]"), int(port_text)), timeout=max(left, 0.05)):
                return
        except OSError as err:
            if time.monotonic() + 0.25 >= deadline:
                raise ConfigError(
                    f"no Ray cluster answers at {address} within {timeout_s:g} s ({err.strerror or err}); start one "
                    "there (ray start --head --port=PORT), fix backend.address, or leave it unset for a local Ray",
                    "backend.address",
                ) from None
            time.sleep(0.25)


def host_cpu_share(num_hosts: int) -> float:
    """CPUs per host when none are configured: the cluster's CPUs split evenly, at most one each."""
    total = float(ray.cluster_resources().get("CPU", 1.0))
    return min(1.0, math.floor(total / num_hosts * 100) / 100)


def _wait_ready(actors: Sequence[Any], refs: list[Any], layout: PoolLayout, cfg: BackendConfig) -> None:
    timeout_s = cfg.start_timeout_s
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        for actor in actors:
            ray.kill(actor)
        host = layout.hosts[0]
        raise RuntimeError(
            f"{len(pending)} of {len(refs)} Ray actors did not start within {timeout_s:.0f} s: backend.num_hosts="
            f"{cfg.num_hosts} at {host.num_cpus} CPU and {host.num_gpus} GPU each does not fit the cluster's "
            f"resources {ray.cluster_resources()}; lower backend.cpus_per_host / gpus_per_host or num_hosts (or raise "
            "backend.start_timeout_s while an autoscaler adds nodes)"
        )
    ray.get(ready)


def _plan_placement(cfg: BackendConfig) -> tuple[PoolLayout, Any, bool]:
    """(layout, placement group or None, whether this backend created that group): the current group when running
    inside one (a Tune trial), else a group of our own for ``placement: pack``, else none (``SPREAD``)."""
    from ray.util.placement_group import get_current_placement_group, placement_group

    group = get_current_placement_group()
    if group is not None:
        layout = layout_in_group(
            group.bundle_specs, cfg.num_hosts, cfg.num_shards, cfg.cpus_per_host, cfg.gpus_per_host, cfg.cpus_per_shard
        )
        return layout, group, False
    host_cpus = cfg.cpus_per_host or host_cpu_share(cfg.num_hosts)
    args = (cfg.num_hosts, cfg.num_shards, host_cpus, cfg.gpus_per_host, cfg.cpus_per_shard)
    if cfg.placement == "pack":
        bundles, layout = pack_layout(*args)
        if bundles:
            return layout, placement_group(bundles, strategy="PACK"), True
    return spread_layout(*args), None, False


def _strategy(slot: ActorSlot, group: Any) -> Any:
    """Ray's scheduling strategy for an actor of ``slot``: pinned to its bundle, or SPREAD outside any group."""
    if group is None or slot.bundle_index is None:
        return "SPREAD"
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=slot.bundle_index)


def _wait_group(group: Any, timeout_s: float) -> None:
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        raise RuntimeError(
            f"backend.placement=pack: the placement group {group.bundle_specs} was not granted within "
            f"{timeout_s:.0f} s by the cluster's resources {ray.cluster_resources()}; lower backend.cpus_per_host / "
            "gpus_per_host or num_hosts, or use backend.placement=spread"
        )


class RayClientHost(ClientHost):
    """``ClientHost`` as a restartable Ray actor, which takes its data set from each call rather than its constructor.

    Ray logs an error for every restartable actor whose constructor arguments live in the object store, because a
    restart fails once they are gone (ray-project/ray#53727). So the constructor takes only small arguments, every
    call carries the data set's object-store reference (inside a list, so that Ray passes the reference instead of
    fetching the data per call), and the host builds itself (``ClientHost.__init__``, mapping the data zero-copy) on
    the first call that finds it unbuilt: ``ready`` at start-up, or the first call after Ray restarted it.
    """

    def __init__(self, host_id: int, *args: Any) -> None:  # ClientHost.__init__ runs in _build
        self.host_id = host_id
        self._args = args
        self._built = False

    def _build(self, dataset: list[Any]) -> None:
        if not self._built:
            super().__init__(self.host_id, ray.get(dataset[0]), *self._args)
            self._built = True

    def ready(self, dataset: list[Any] | None = None) -> int:
        if dataset is not None:
            self._build(dataset)
        return self.host_id

    def run_round_on(self, dataset: list[Any], *args: Any) -> tuple[object, ...]:
        """``run_round`` (its arguments after the data set's reference)."""
        self._build(dataset)
        return self.run_round(*args)

    def evaluate_on(self, dataset: list[Any], *args: Any) -> EvalStats:
        """``evaluate`` (its arguments after the data set's reference)."""
        self._build(dataset)
        return self.evaluate(*args)


def _ready_call(actor: Any, *args: Any) -> Any:
    """A round trip to ``actor`` that Ray retries until the actor is back (harmless to repeat), for ``Recovery`` to
    wait on its replacement without polling (a host's rebuilds it)."""
    return partial(actor.ready.options(max_task_retries=-1).remote, *args)


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
        dataset_ref: Any = None,
    ) -> None:
        ensure_ray(backend_cfg)
        self.num_hosts = backend_cfg.num_hosts
        self.num_shards = backend_cfg.num_shards
        self.eval_batch_size = eval_batch_size
        self.num_test = len(dataset.y_test)
        self.sizes = dataset.client_sizes()
        self.shard_of = plan_shards(shapes, self.num_shards)
        self.hosts: list[Any] = []
        self.dataset_ref: Any = None
        self.shards: list[Any] = []
        self._group: Any = None
        self._own_group = False
        self.algorithm = algorithm
        # per-client state across rounds as object-store references (engine/client_state.py)
        self.memories = ClientStateStore(fetch=ray.get, put=ray.put)
        # dead hosts and shards: Ray restarts them, the driver re-runs their lost calls (engine/recovery.py)
        self.recovery = Recovery(backend_cfg.max_actor_failures, backend_cfg.start_timeout_s)
        self._dataset_arg: list[Any] = []
        self._names = [[n for n, k in self.shard_of.items() if k == s] for s in range(self.num_shards)]
        try:
            self._start_actors(dataset, model_cfg, algorithm, backend_cfg, init_seed, compression, dataset_ref)
        except BaseException:
            self.close()
            raise
        log.info(
            "ray backend: %d client hosts on nodes %s, %d parameter-server shards%s",
            self.num_hosts,
            ",".join(self.node_ids()),
            self.num_shards,
            "" if self._group is None else f", in placement group {self._group.id.hex()}",
        )

    def _start_actors(
        self,
        dataset: FederatedDataset,
        model_cfg: ModelConfig,
        algorithm: Algorithm,
        backend_cfg: BackendConfig,
        init_seed: int,
        compression: CompressionConfig | None,
        dataset_ref: Any = None,
    ) -> None:
        layout, self._group, self._own_group = _plan_placement(backend_cfg)
        if self._own_group:
            _wait_group(self._group, backend_cfg.start_timeout_s)
        group = self._group
        if dataset_ref is None:  # not placed by ``build.prepare_run``
            dataset_ref = ray.put(dataset)
        self.dataset_ref = dataset_ref  # what every host maps (a replacement host needs the same)
        # the data set's reference, carried by every host call (RayClientHost): a restarted host rebuilds from it
        self._dataset_arg = [dataset_ref]
        host_cls, shard_cls = ray.remote(RayClientHost), ray.remote(ParamServerShard)
        self.hosts = [
            host_cls.options(
                num_cpus=slot.num_cpus,
                num_gpus=slot.num_gpus,
                max_restarts=-1,  # restarted in its slot when its process dies; recovery.py re-runs its lost calls
                scheduling_strategy=_strategy(slot, group),
            ).remote(h, model_cfg, algorithm, backend_cfg, init_seed, compression)
            for h, slot in enumerate(layout.hosts)
        ]
        self.shards = [
            shard_cls.options(
                num_cpus=slot.num_cpus, max_restarts=-1, scheduling_strategy=_strategy(slot, group)
            ).remote(s, self._names[s])
            for s, slot in enumerate(layout.shards)
        ]
        refs = [h.ready.remote(self._dataset_arg) for h in self.hosts] + [s.ready.remote() for s in self.shards]
        _wait_ready([*self.hosts, *self.shards], refs, layout, backend_cfg)

    def train_and_reduce(self, tasks: Sequence[TrainTask], params: Params) -> tuple[Aggregate, list[ClientOutcome]]:
        self.shard_of, names = shard_plan(self.shard_of, params, self.num_shards, self.shards)
        if names is not None:  # every reduce call names its shard's tensors (a restarted shard knows only the first)
            self._names = names
        if tasks:
            self.recovery.begin_round(tasks[0].round_idx)
        params_ref = ray.put(to_numpy(params))
        keep = keeps_state(self.algorithm, tasks)
        groups = {h: g for h, g in enumerate(tasks_by_host(tasks, self.sizes, self.num_hosts)) if g}
        # the driver fetches each host's outcomes (return ``num_shards``); its partial sums go straight to the shards
        steps = {
            h: Step(
                f"client host {h}",
                partial(self._run_round, h, g, params_ref, keep),
                _ready_call(self.hosts[h], self._dataset_arg),
                probe=self.num_shards,
            )
            for h, g in groups.items()
        }
        while True:
            # Shards are called once every host's call has finished (its outcomes fetched): a shard never waits on
            # the partial sums of a host that died, and a host's re-run is all that a host's death costs.
            ran: dict[int, list[Any]] = {}
            outcome_lists = self.recovery.gather(steps, ran)
            try:
                results = self.recovery.gather(self._reduce_steps(params_ref, ran))
            except InputsLost:  # finished partial sums lost with their node: the round's hosts run again
                continue
            break
        if keep:  # each client's next memory stays in the object store, referenced from here
            for h, host_tasks in groups.items():
                self.memories.update(host_tasks, ran[h][self.num_shards + 1 :])
        outcomes = sorted((o for h in sorted(outcome_lists) for o in outcome_lists[h]), key=lambda o: o.client_id)
        return assemble_aggregate([results[s] for s in range(self.num_shards)], outcomes), outcomes

    def _run_round(self, h: int, tasks: list[TrainTask], params_ref: Any, keep: bool) -> list[Any]:
        """Submit host ``h``'s share of a round (again, after a death: the same tasks and the same memories, which
        the store still references until the round succeeds)."""
        held = self.memories.handles_for(tasks) if keep else []
        return list(
            self.hosts[h]
            .run_round_on.options(num_returns=self.num_shards + 1 + len(held))
            .remote(self._dataset_arg, tasks, params_ref, self.shard_of, self.num_shards, *held)
        )

    def _reduce_steps(self, params_ref: Any, ran: dict[int, list[Any]]) -> dict[int, Step]:
        """Shard ``s`` reduces the hosts' partials for it, in host-id order."""

        def submit(s: int) -> list[Any]:
            parts = [ran[h][s] for h in sorted(ran)]
            return [self.shards[s].reduce.remote(params_ref, *parts, names=self._names[s])]

        return {
            s: Step(f"parameter-server shard {s}", partial(submit, s), _ready_call(shard), recompute_inputs=True)
            for s, shard in enumerate(self.shards)
        }

    def evaluate(
        self, params: Params, units: tuple[int, ...] | None = None, model_config: ModelConfig | None = None
    ) -> EvalResult:
        params_ref = ray.put(to_numpy(params))
        batches = eval_batches(self.num_test, self.eval_batch_size, self.num_hosts)

        def submit(h: int, ids: list[int]) -> list[Any]:
            args = (params_ref, ids, self.eval_batch_size, units, model_config)
            return [self.hosts[h].evaluate_on.remote(self._dataset_arg, *args)]

        steps = {
            h: Step(f"client host {h}", partial(submit, h, b), _ready_call(self.hosts[h], self._dataset_arg))
            for h, b in enumerate(batches)
            if b
        }
        stats = self.recovery.gather(steps)
        return combine_eval([stats[h] for h in sorted(stats)])

    def take_faults(self) -> int:
        """Actor failures survived since the last call (``RoundRecord.faults``)."""
        return self.recovery.take_faults()

    def client_states(self) -> dict[int, object]:
        """Every client's memory by client id (fetched from the object store), for checkpoints."""
        return self.memories.client_states()

    def load_client_states(self, states: dict[int, object]) -> None:
        self.memories.load_client_states(states)

    def node_ids(self) -> list[str]:
        """The Ray node each client host runs on (for placement checks)."""
        return list(
            ray.get([h.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id()) for h in self.hosts])
        )

    def close(self) -> None:
        """Release the actors and placement group; Ray itself stays up for the next run (``ensure_ray``)."""
        self._release()

    def _release(self) -> None:
        """Kill the actors and give back a placement group this backend reserved (never a Tune trial's)."""
        for actor in [*self.hosts, *self.shards]:
            ray.kill(actor)
        self.hosts, self.shards = [], []
        if self._own_group:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._group)
            self._own_group = False
