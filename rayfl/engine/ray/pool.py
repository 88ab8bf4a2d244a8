"""The Ray backend's actors: client hosts and parameter-server shards, started early and kept warm on request.

**Started before the data exists.** A host's constructor takes only its id; what it is built from (the data set and its
recipe: model, algorithm, backend and compression configs, template seed, and the driver's working directory, where
users' factories resolve from) comes as object-store references with every call, and the host builds itself on the first
call that brings references it was not built from (``RayClientHost``). So ``build.prepare_run`` creates the pool as soon
as Ray is up: the actors' processes start and import torch and rayfl while the driver is still preparing the data, and
``ActorPool.ready`` later hands them the run's references. Shards name their tensors in every ``reduce`` call, so they
start with none.

**Warm across runs** (``backend.keep_warm``): a run that ends parks its pool here instead of killing it (its hosts
drop the run's data and models); the next run in the process whose layout (Ray instance, actor classes, CPU/GPU per
actor, placement) is the same takes it, and its hosts rebuild themselves from the new run's references on its first
call, so a reused host holds nothing of the run before. Parked actors keep their CPU reservations, which other Ray
work in the process would wait for: that is why warmth is asked for, never assumed, and why ``release_warm_pool``
(also called by ``shutdown_ray`` and before a Tune sweep) exists. Inside a placement group (a Tune trial) a pool is
never parked: the group ends with the trial.

Where the actors go is decided in ``placement.py``; a host or shard that dies is restarted by Ray and its lost calls
re-run (``recovery.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import ray

from rayfl.config.sections import BackendConfig
from rayfl.core.messages import TrainTask
from rayfl.engine.exec.client_state import ClientMemory
from rayfl.engine.exec.host import ClientHost, EvalStats
from rayfl.engine.exec.param_server import ParamServerShard
from rayfl.engine.ray.head import off_node, reserved_head
from rayfl.engine.ray.placement import ActorSlot, PoolLayout, layout_in_group, pack_layout, spread_layout
from rayfl.engine.ray.state_stores import aligned, by_store
from rayfl.engine.ray.watchdog import watchdog_group
from rayfl.models.custom import search_from

__all__ = ["ActorPool", "RayClientHost", "host_cpu_share", "prestart_pool", "release_warm_pool", "take_pool"]

log = logging.getLogger(__name__)


class RayClientHost(ClientHost):
    """``ClientHost`` as a restartable, reusable Ray actor, built from the references each call carries.

    Ray logs an error for every restartable actor whose constructor arguments live in the object store, because a
    restart fails once they are gone (ray-project/ray#53727). So the constructor takes only the host's id, and every
    call carries ``run``: the data set's and the recipe's object-store references (inside a list, so that Ray passes
    the references instead of fetching the data per call). The host builds itself (``ClientHost.__init__``, mapping
    the data zero-copy) on the first call whose references differ from those it was built from: ``ready`` at
    start-up, the first call after Ray restarted it, or the first call of a later run on a warm pool.
    """

    def __init__(self, host_id: int) -> None:  # ClientHost.__init__ runs in _build
        self.host_id = host_id
        self._built_from: tuple[str, ...] | None = None

    def _build(self, run: list[Any]) -> None:
        key = tuple(ref.hex() for ref in run)
        if self._built_from != key:
            self.park()  # nothing of an earlier run's host survives a rebuild
            dataset, (driver_dir, recipe) = ray.get(list(run))
            search_from(driver_dir)  # users' import paths resolve as on the driver (models/custom.py)
            super().__init__(self.host_id, dataset, *recipe)
            self._built_from = key

    def park(self) -> int:
        """Drop what the host was built from (a warm pool waits for its next run without holding a data set)."""
        host_id = self.host_id
        self.__dict__.clear()
        self.host_id, self._built_from = host_id, None
        return host_id

    def ready(self, run: list[Any] | None = None) -> int:
        if run is not None:
            self._build(run)
        return self.host_id

    def trained(self) -> int:
        """``ClientHost.trained`` (0 while the host is parked: it was built from no run)."""
        return int(self.__dict__.get("clients_trained", 0))

    @watchdog_group
    def progress(self) -> int:
        """The watchdog's ping (``watchdog.py``): the host's units of work done (``ClientHost.work_done``), answered
        from a thread of its own while a call runs, so only a host that runs no Python at all (stopped, hung in
        native code) leaves it unanswered, and one blocked with the interpreter lock released answers a count that
        stands still."""
        return int(self.__dict__.get("work_done", 0))

    def run_round_on(
        self,
        run: list[Any],
        tasks: Sequence[TrainTask],
        params: Any,
        shard_of: Mapping[str, int],
        num_shards: int,
        initial: Any,
        stores: int,
        *fetched: Mapping[int, object],
    ) -> tuple[object, ...]:
        """``run_round`` (``params``: the global tensors, or the list of the parameter-server shards' parts of them,
        ``RayBackend._put``). With ``stores`` (the clients carry memories, ``state_stores.py``): ``fetched`` holds
        each store's memories of these clients, and the next memories come back as one return per store after the
        outcomes."""
        self._build(run)
        memories = cast(list[ClientMemory | None], aligned((t.client_id for t in tasks), fetched) if stores else [])
        out = self.run_round(tasks, _joined(params), shard_of, num_shards, initial, *memories)
        return _per_store(out, num_shards + 1, tasks, stores)

    def run_clients_on(
        self, run: list[Any], tasks: Sequence[TrainTask], params: Any, initial: Any, stores: int, *fetched: Any
    ) -> tuple[object, ...]:
        """``run_clients``, its clients' memories as in ``run_round_on``."""
        self._build(run)
        memories = cast(list[ClientMemory | None], aligned((t.client_id for t in tasks), fetched) if stores else [])
        return _per_store(self.run_clients(tasks, params, initial, *memories), 1, tasks, stores)

    def reduce_uploads_on(
        self,
        run: list[Any],
        params: Any,
        shard_of: Mapping[str, int],
        num_shards: int,
        client_ids: Sequence[int],
        *fetched: Mapping[int, object],
    ) -> tuple[object, ...]:
        """``reduce_uploads`` over the kept uploads of ``client_ids`` (in that order), read from the stores' ``take``
        results ``fetched``; ``params`` as in ``run_round_on``."""
        self._build(run)
        memories = cast(list[ClientMemory | None], aligned(client_ids, fetched))
        return self.reduce_uploads(_joined(params), shard_of, num_shards, *memories)

    def evaluate_on(self, run: list[Any], *args: Any) -> EvalStats:
        """``evaluate`` (its arguments after the run's references)."""
        self._build(run)
        return self.evaluate(*args)


def _watched_shard(shard_cls: type[ParamServerShard]) -> Any:
    """``shard_cls`` as a Ray actor class that answers the watchdog's pings (``progress``) from a thread of its own
    (made per pool, so that a test's swapped-in shard class gets its ping too)."""

    class RayParamServerShard(shard_cls):  # type: ignore[valid-type,misc]
        @watchdog_group
        def progress(self) -> int:
            """The watchdog's ping: the shard's units of work done (``ParamServerShard.work_done``)."""
            return int(self.work_done)

    return ray.remote(concurrency_groups={"watchdog": 1})(RayParamServerShard)


def _per_store(out: tuple[object, ...], head: int, tasks: Sequence[TrainTask], stores: int) -> tuple[object, ...]:
    """A host call's result with the next memories after its first ``head`` returns regrouped by store."""
    if not stores:
        return out
    return (*out[:head], *by_store([t.client_id for t in tasks], out[head:], stores))


def _joined(params: Any) -> Any:
    """The global tensors from the shards' parts (a list of object references, fetched zero-copy), or as given."""
    if isinstance(params, list):
        whole: dict[str, Any] = {}
        for part in ray.get(params):
            whole.update(part)
        return whole
    return params


def host_cpu_share(num_hosts: int, avoid: str | None = None) -> float:
    """CPUs per host when none are configured: the cluster's CPUs (those of node ``avoid``, a reserved head, left
    out) split evenly, at most one each."""
    total = float(ray.cluster_resources().get("CPU", 1.0))
    if avoid is not None:
        total -= sum(float(n["Resources"].get("CPU", 0.0)) for n in ray.nodes() if n.get("NodeID") == avoid)
    if total <= 0:  # no CPU outside the reserved head yet (an autoscaler's workers to come): one each
        return 1.0
    return min(1.0, math.floor(total / num_hosts * 100) / 100)


@dataclass
class ActorPool:
    """One run's hosts and shards, where they were placed, and what a later run must match to reuse them."""

    hosts: list[Any]
    shards: list[Any]
    layout: PoolLayout
    group: Any  # the placement group the actors are pinned in, or None (SPREAD)
    own_group: bool  # the group was reserved for this pool (``placement: pack``) and goes with it
    key: tuple[Any, ...]  # the Ray instance, actor classes, layout and own bundles (``_pool_key``)
    fresh: bool = False  # started for the next run (``prestart_pool``) and not yet taken: nothing to check

    def ready(self, run: list[Any], cfg: BackendConfig) -> None:
        """Wait until every host is built from ``run`` and every shard answers."""
        refs = [h.ready.remote(run) for h in self.hosts] + [s.ready.remote() for s in self.shards]
        _wait_ready(self, refs, cfg)

    def alive(self, timeout_s: float) -> bool:
        """Every actor answers (a warm pool's actor may have been killed since)."""
        try:
            ray.get([a.ready.remote() for a in [*self.hosts, *self.shards]], timeout=timeout_s)
        except ray.exceptions.RayError:
            return False
        return True

    def release(self, wait_s: float = 0.0) -> None:
        """Kill the actors and give back a placement group this pool reserved (never a Tune trial's); ``wait_s``
        (default ``_GONE_TIMEOUT_S``) bounds the wait for them to be gone."""
        actors = [*self.hosts, *self.shards]
        for actor in actors:
            with contextlib.suppress(ray.exceptions.RayError, ValueError):  # already gone (or its Ray is)
                ray.kill(actor)
        self.hosts, self.shards = [], []
        _await_gone(actors, wait_s or _GONE_TIMEOUT_S)
        if self.own_group:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            self.own_group = False

    def close(self, keep_warm: bool) -> None:
        """End of a run: park the pool for the next run (``keep_warm``, outside a Tune trial's group) or release
        it."""
        global _warm
        if not keep_warm or (self.group is not None and not self.own_group) or not self.hosts:
            self.release()
            return
        if _warm is not None and _warm is not self:
            _warm.release()
        for host in self.hosts:
            host.park.remote()  # runs before the next run's first call (calls from one caller keep their order)
        _warm = self


_GONE_TIMEOUT_S = 30.0  # how long ``release`` waits for killed actors to stop answering before it only warns


def _await_gone(actors: Sequence[Any], timeout_s: float) -> None:
    """Return once every killed actor refuses calls (or after ``timeout_s``, with a warning).

    ``ray.kill`` only sends the request: a call made right after it can still be answered by the old process
    (16 of 120 calls in a probe on Ray 2.60, 2 cores), and the actor's CPUs are back with Ray only once it is dead.
    A run that returns has given its actors back, so a next run or a Tune trial finds the CPUs free.
    """
    if not actors or not ray.is_initialized():
        return
    deadline = time.monotonic() + timeout_s
    left = list(actors)
    while left:
        calls = [(actor, actor.ready.remote()) for actor in left]
        left = []
        for actor, ref in calls:
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.ActorUnavailableError:  # on its way down: ask again
                pass
            except ray.exceptions.RayActorError:  # dead
                continue
            except ray.exceptions.GetTimeoutError:
                pass
            left.append(actor)
        if left and time.monotonic() >= deadline:
            log.warning("%d killed actors still answer calls after %.0f s", len(left), timeout_s)
            return
        if left:
            time.sleep(0.01)


_warm: ActorPool | None = None  # the pool parked by the last run with backend.keep_warm, if any


def release_warm_pool() -> bool:
    """Kill the parked pool's actors (their CPU reservations go back to Ray); returns whether there was one."""
    global _warm
    warm, _warm = _warm, None
    if warm is None:
        return False
    warm.release()
    return True


def prestart_pool(cfg: BackendConfig) -> None:
    """Create the actors of a run that is about to start and park them for its ``take_pool`` (``ray_session.
    prestart``): they start while the caller loads the data. The run releases them at its end unless it keeps them
    warm."""
    global _warm
    pool = take_pool(cfg)
    pool.fresh = True
    _warm = pool


def take_pool(cfg: BackendConfig) -> ActorPool:
    """The parked pool when it matches this run's layout (and all its actors answer), else a new pool whose actors
    are being created: they start and import while the caller goes on; ``ActorPool.ready`` waits for them."""
    global _warm
    layout, group, bundles = _plan_placement(cfg)
    key = _pool_key(layout, bundles)
    warm, _warm = _warm, None
    if warm is not None:
        if group is None and warm.key == key and (warm.fresh or warm.alive(cfg.start_timeout_s)):
            if not warm.fresh:
                log.info("reusing the last run's %d client hosts and %d shards", len(warm.hosts), len(warm.shards))
            warm.fresh = False
            return warm
        warm.release()
    own_group = False
    if bundles:
        from ray.util.placement_group import placement_group

        keep_off = off_node(layout.avoid)
        group = placement_group(
            bundles, strategy="PACK", bundle_label_selector=None if keep_off is None else [keep_off] * len(bundles)
        )
        own_group = True
        _wait_group(group, cfg, layout)
    pool = ActorPool([], [], layout, group, own_group, key)
    try:
        # the watchdog's pings run in a group of their own, beside the call in flight (the default group: one at a
        # time, in order)
        host_cls = ray.remote(concurrency_groups={"watchdog": 1})(RayClientHost)
        shard_cls = _watched_shard(ParamServerShard)
        pool.hosts = [
            host_cls.options(
                num_cpus=slot.num_cpus,
                num_gpus=slot.num_gpus,
                max_restarts=-1,  # restarted in its slot when its process dies; recovery.py re-runs its lost calls
                **_where(slot, group, layout.avoid),
            ).remote(h)
            for h, slot in enumerate(layout.hosts)
        ]
        pool.shards = [  # every reduce call names the shard's tensors: it starts with none
            shard_cls.options(num_cpus=slot.num_cpus, max_restarts=-1, **_where(slot, group, layout.avoid)).remote(
                s, ()
            )
            for s, slot in enumerate(layout.shards)
        ]
    except BaseException:
        pool.release()
        raise
    return pool


def _pool_key(layout: PoolLayout, bundles: list[dict[str, float]] | None) -> tuple[Any, ...]:
    """What a parked pool must share with a run to serve it: the Ray instance, the actor classes (tests swap in
    their own), each actor's resources and slot, and the bundles of a group of its own."""
    own = tuple(tuple(sorted(b.items())) for b in bundles or ())
    return (str(ray.get_runtime_context().gcs_address), RayClientHost, ParamServerShard, layout, own)


def _plan_placement(cfg: BackendConfig) -> tuple[PoolLayout, Any, list[dict[str, float]] | None]:
    """(layout, the placement group the caller runs in or None, the bundles of a group of the pool's own): inside a
    group (a Tune trial) its bundles; for ``placement: pack`` a ``PACK`` group to reserve; else none (``SPREAD``)."""
    from ray.util.placement_group import get_current_placement_group

    group = get_current_placement_group()
    if group is not None:  # a Tune trial's group: the sweep kept its bundles off a reserved head
        layout = layout_in_group(
            group.bundle_specs,
            cfg.num_hosts,
            cfg.num_shards,
            cfg.cpus_per_host,
            cfg.gpus_per_host,
            cfg.cpus_per_shard,
            gpu_hosts=cfg.gpu_hosts,
        )
        return layout, group, None
    avoid = reserved_head(cfg.head)
    host_cpus = cfg.cpus_per_host or host_cpu_share(cfg.num_hosts, avoid)
    args = (cfg.num_hosts, cfg.num_shards, host_cpus, cfg.gpus_per_host, cfg.cpus_per_shard, cfg.gpu_hosts)
    if cfg.placement == "pack":
        bundles, layout = pack_layout(*args)
        if bundles:
            return dataclasses.replace(layout, avoid=avoid), None, bundles
    return dataclasses.replace(spread_layout(*args), avoid=avoid), None, None


def _where(slot: ActorSlot, group: Any, avoid: str | None) -> dict[str, Any]:
    """Ray's placement options for an actor of ``slot``: pinned to its bundle of ``group``, or SPREAD outside any
    group, off node ``avoid`` (a reserved head; a group's bundles were kept off it when the group was made)."""
    if group is None or slot.bundle_index is None:
        keep_off = off_node(avoid)
        return {"scheduling_strategy": "SPREAD", **({} if keep_off is None else {"label_selector": keep_off})}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=slot.bundle_index)
    }


def _wait_group(group: Any, cfg: BackendConfig, layout: PoolLayout) -> None:
    ready, _ = ray.wait([group.ready()], timeout=cfg.start_timeout_s)
    if not ready:
        from ray.util.placement_group import remove_placement_group

        from rayfl.engine.ray.cluster_fit import not_started_error

        remove_placement_group(group)
        waited = f"backend.placement=pack: the placement group was not granted within {cfg.start_timeout_s:g} s"
        raise not_started_error(layout, cfg, waited)


def _wait_ready(pool: ActorPool, refs: Sequence[Any], cfg: BackendConfig) -> None:
    timeout_s = cfg.start_timeout_s
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    if pending:
        from rayfl.engine.ray.cluster_fit import not_started_error

        error = not_started_error(
            pool.layout, cfg, f"{len(pending)} of {len(refs)} Ray actors did not start within {timeout_s:g} s"
        )
        pool.release(wait_s=min(_GONE_TIMEOUT_S, timeout_s))
        raise error
    ray.get(ready)
