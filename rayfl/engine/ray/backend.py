"""The Ray backend: a pool of ``ClientHost`` actors and ``ParamServerShard`` actors.

Per run, the data set is put in the object store once and every host maps it zero-copy. Per round, the global
parameters are put once; the round's clients go to the hosts as calls (``engine/exec/dispatch.py``): small batches
that each host takes as it comes free (``backend.dispatch: pull``, ``engine/ray/dispatch.py``), or one share per host
dealt up front (``static``). Each call returns one partial sum per shard (``num_returns = shards + 1``), which goes
straight to the shards without passing through the driver; shards reduce the partials in call order (batch order,
or host order for static shares), never in the order they finished. rayfl starts a local Ray instance only if none
is running, reuses a running one for later runs in the process, and shuts down only what it started
(``ray_session.py``), so it can run inside Tune trials and users' sessions. The actors themselves (started before the
data exists, kept warm across runs on request, placed by ``placement.py``) are ``ray_pool.py``'s. A host or shard that
dies is restarted by Ray and its lost work re-run by the driver (``recovery.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, cast

import ray

from rayfl.config.model import ModelConfig
from rayfl.config.sections import BackendConfig, CompressionConfig
from rayfl.core.messages import Aggregate, ClientOutcome, Params, TrainTask
from rayfl.data.federated import FederatedDataset
from rayfl.engine.exec.backend import (
    EvalResult,
    assemble_aggregate,
    combine_eval,
    eval_batches,
    shard_plan,
    to_numpy,
    uploads_by_host,
)
from rayfl.engine.exec.client_state import KeptUpload, keeps_state, pads
from rayfl.engine.exec.dispatch import call_plan, host_kinds
from rayfl.engine.exec.param_server import plan_shards
from rayfl.engine.ray.data_ship import Ship, ship
from rayfl.engine.ray.dispatch import pull
from rayfl.engine.ray.pool import ActorPool, release_warm_pool, take_pool
from rayfl.engine.ray.recovery import InputsLost, Recovery, Step, lost
from rayfl.engine.ray.session import ensure_ray, shutdown_ray
from rayfl.engine.ray.state_stores import ClientStateStores
from rayfl.fl.api.algorithm import Algorithm

__all__ = ["RayBackend", "ensure_ray", "release_warm_pool", "share", "shutdown_ray"]

log = logging.getLogger(__name__)


def share(dataset: FederatedDataset, data_ship: Ship = "object_store") -> tuple[Any, FederatedDataset]:
    """Put ``dataset`` in the object store, its memory maps by path where ``data_ship`` says so (``data_ship.py``);
    returns its reference and the store's zero-copy view of it, which the caller keeps instead of its own copy
    (read-only arrays, shared with the hosts on this node)."""
    ref = ray.put(ship(dataset, data_ship))
    return ref, ray.get(ref)


def _ready_call(actor: Any, *args: Any) -> Any:
    """A round trip to ``actor`` that Ray retries until the actor is back (harmless to repeat), for ``Recovery`` to
    wait on its replacement without polling (a host's rebuilds it)."""
    return partial(actor.ready.options(max_task_retries=-1).remote, *args)


def _watched(actor: Any) -> dict[str, Any]:
    """The watchdog's handles on ``actor`` (``recovery.Step``): a ping answered with its progress while it works, and
    a kill after which Ray replaces it."""
    return {"ping": actor.progress.remote, "kill": partial(ray.kill, actor, no_restart=False)}


def _training(tasks: Sequence[TrainTask]) -> str:
    """What a host call of ``tasks`` does, for the watchdog's line."""
    return f"training clients {', '.join(str(t.client_id) for t in tasks)}"


def _memories_of(tasks: Sequence[TrainTask]) -> str:
    """How a host call's client memories are named in a message."""
    return f"the client memories of clients {', '.join(str(t.client_id) for t in tasks)}"


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
        pool: ActorPool | None = None,
    ) -> None:
        ensure_ray(backend_cfg)
        self.num_hosts = backend_cfg.num_hosts
        self.num_shards = backend_cfg.num_shards
        self.keep_warm = backend_cfg.keep_warm
        self.dispatch, self.clients_per_call = backend_cfg.dispatch, backend_cfg.clients_per_call
        self.kinds = host_kinds(backend_cfg)  # a mixed pool's GPU and CPU hosts, or None
        self.eval_batch_size = eval_batch_size
        self.num_test = len(dataset.y_test)
        self.sizes = dataset.client_sizes()
        self.shard_of = plan_shards(shapes, self.num_shards)
        self.algorithm = algorithm
        self._initial: tuple[Params | None, Any] = (None, None)  # the initial tensors last put, and their reference
        # dead hosts and shards: Ray restarts them, the driver re-runs their lost calls (engine/ray/recovery.py)
        self.recovery = Recovery(
            backend_cfg.max_actor_failures,
            backend_cfg.replace_timeout_s,
            backend_cfg.hang_timeout_s,
            backend_cfg.stall_timeout_s,
        )
        # per-client state across rounds, kept by one state-store actor per node (engine/ray/state_stores.py)
        self.memories = ClientStateStores(self.node_ids, self.recovery.watchdog)
        self._names = [[n for n, k in self.shard_of.items() if k == s] for s in range(self.num_shards)]
        # started by ``build.prepare_run`` while the data was prepared, or here (``ray_pool.py``)
        self.pool = pool if pool is not None else take_pool(backend_cfg)
        self.hosts, self.shards = self.pool.hosts, self.pool.shards
        try:
            if dataset_ref is None:  # not placed by ``build.prepare_run``
                dataset_ref = ray.put(dataset)
            self.dataset_ref = dataset_ref  # what every host maps (a replacement host needs the same)
            # The run's references, carried by every host call: a host builds itself from them on the first call
            # that brings new ones (RayClientHost), a restarted host on its first call after the restart.
            # the driver's working directory: where users' factories resolve from on every host (models/custom.py)
            recipe_ref = ray.put((os.getcwd(), (model_cfg, algorithm, backend_cfg, init_seed, compression)))
            self._run_arg: list[Any] = [dataset_ref, recipe_ref]
            self.pool.ready(self._run_arg, backend_cfg)
        except BaseException:
            self.pool.release()
            raise
        group = self.pool.group
        log.info(
            "ray backend: %d client hosts on nodes %s, %d parameter-server shards on nodes %s%s%s",
            self.num_hosts,
            ",".join(self.node_ids()),
            self.num_shards,
            ",".join(_nodes_of(self.shards)),
            "" if group is None else f", in placement group {group.id.hex()}",
            "" if self.pool.layout.avoid is None else f", head node {self.pool.layout.avoid} reserved",
        )

    def begin_round(self, round_idx: int) -> None:
        """The actor-failure limit counts per round and the give-up message names the round: set here, at the round's
        start, because a round whose clients all failed in planning runs no training, only its evaluation."""
        self.recovery.begin_round(round_idx)

    def train_and_reduce(
        self, tasks: Sequence[TrainTask], params: Params, initial: Params | None = None
    ) -> tuple[Aggregate, list[ClientOutcome]]:
        """One round's training and reduction; ``initial`` (the run's initial global tensors,
        ``client_state.first_values``) is what padding clients fall back to: put in the object store once, again only
        when the driver hands a new dict (a model was added)."""
        params_ref = self._put(params)
        if initial is not None and pads(tasks) and initial is not self._initial[0]:
            self._initial = (initial, ray.put(to_numpy(initial)))
        initial_ref = self._initial[1] if initial is not None and pads(tasks) else None
        keep = keeps_state(self.algorithm, tasks)
        if keep:
            self.memories.start()
        groups, hosts_of = self._groups(tasks)
        fetched = self._fetch(groups) if keep else {}

        # the driver fetches each call's outcomes (return ``num_shards``); its partial sums go straight to the shards
        def step_on(k: int, h: int) -> Step:
            submit = partial(self._run_round, h, groups[k], params_ref, initial_ref, fetched.get(k))
            return self._host_step(h, submit, _training(groups[k]), self._reads(groups[k], keep), self.num_shards)

        outcome_lists, results, ran = self._run_and_reduce(list(groups), step_on, params_ref, hosts_of=hosts_of)
        if keep:  # each call's next memories go from its host to the stores directly
            self._keep(groups, ran, self.num_shards + 1)
        outcomes = sorted((o for k in sorted(outcome_lists) for o in outcome_lists[k]), key=lambda o: o.client_id)
        return assemble_aggregate(results, outcomes), outcomes

    def _groups(self, tasks: Sequence[TrainTask]) -> tuple[dict[int, list[TrainTask]], dict[int, tuple[int, ...]]]:
        """The round's host calls by their place in the reduction order (``dispatch.call_plan``; static: the host
        id), empty ones left out, and the hosts that may make each (a mixed pool's calls go to one kind of host)."""
        plan = call_plan(tasks, self.sizes, self.num_hosts, self.dispatch, self.clients_per_call, self.kinds)
        kept = {k: c for k, c in enumerate(plan) if c.tasks}
        return {k: c.tasks for k, c in kept.items()}, {k: c.hosts for k, c in kept.items()}

    def _reads(self, tasks: Sequence[TrainTask], keep: bool) -> str:
        """The client memories a call of ``tasks`` reads (``recovery.Step.state``), or "" when it reads none."""
        return _memories_of(tasks) if keep and any(t.client_id in self.memories.held for t in tasks) else ""

    def _host_step(
        self, h: int, submit: Callable[[], Sequence[Any]], doing: str, state: str = "", probe: int = 0
    ) -> Step:
        """A call on host ``h`` as a ``recovery.Step`` (re-run when the host dies, watched for hangs and stalls;
        ``doing``: what the call does, for the watchdog's line)."""
        return Step(
            f"client host {h}",
            submit,
            _ready_call(self.hosts[h], self._run_arg),
            probe=probe,
            state=state,
            doing=doing,
            **_watched(self.hosts[h]),
        )

    def _run_calls(
        self,
        keys: Sequence[int],
        step_on: Callable[[int, int], Step],
        ran: dict[int, list[Any]],
        static: bool,
        hosts_of: Mapping[int, Sequence[int]] | None = None,
    ) -> dict[int, Any]:
        """Run the calls ``keys`` (``step_on(key, host)``): each on its own host (``static``: key ``h`` on host
        ``h``), or pulled by whichever host is free (among ``hosts_of[key]`` when given)."""
        if static:
            return self.recovery.gather({k: step_on(k, k) for k in keys}, ran)
        return pull(self.recovery, keys, step_on, self.num_hosts, ran, hosts_of)

    def train_each(
        self, tasks: Sequence[TrainTask], params: Params, initial: Params | None = None
    ) -> tuple[dict[int, KeptUpload], list[ClientOutcome]]:
        """``Backend.train_each`` on the actors: each host's uploads come back to the driver (an asynchronous run's
        server holds them until they arrive in simulated time); a host that dies is re-run as in
        ``train_and_reduce``."""
        params_ref = ray.put(to_numpy(params))
        if initial is not None and pads(tasks) and initial is not self._initial[0]:
            self._initial = (initial, ray.put(to_numpy(initial)))
        initial_ref = self._initial[1] if initial is not None and pads(tasks) else None
        keep = keeps_state(self.algorithm, tasks)
        if keep:
            self.memories.start()
        groups, hosts_of = self._groups(tasks)
        held = self._fetch(groups) if keep else {}
        stores = self.memories.count if keep else 0

        def submit(h: int, k: int) -> list[Any]:
            call = self.hosts[h].run_clients_on.options(num_returns=1 + stores)
            refs = call.remote(self._run_arg, groups[k], params_ref, initial_ref, stores, *held.get(k, []))
            return list(refs) if stores else [refs]

        def step_on(k: int, h: int) -> Step:
            return self._host_step(h, partial(submit, h, k), _training(groups[k]), self._reads(groups[k], keep))

        ran: dict[int, list[Any]] = {}
        fetched = self._run_calls(list(groups), step_on, ran, self.dispatch == "static", hosts_of)
        if keep:
            self._keep(groups, ran, 1)
        uploads: dict[int, KeptUpload] = {}
        outcomes: list[ClientOutcome] = []
        for k in sorted(fetched):
            got, done = fetched[k]
            uploads.update(got)
            outcomes.extend(done)
        outcomes.sort(key=lambda o: o.client_id)
        return {c: uploads[c] for c in sorted(uploads)}, outcomes

    def _run_round(
        self, h: int, tasks: list[TrainTask], params_ref: Any, initial_ref: Any, fetched: list[Any] | None
    ) -> list[Any]:
        """Submit host ``h``'s share of a round (again, after a death: the same tasks and the same fetched memories,
        ``fetched``: one reference per store, or ``None`` when the clients carry no memories)."""
        stores = len(fetched) if fetched is not None else 0
        return list(
            self.hosts[h]
            .run_round_on.options(num_returns=self.num_shards + 1 + stores)
            .remote(
                self._run_arg, tasks, params_ref, self.shard_of, self.num_shards, initial_ref, stores, *(fetched or [])
            )
        )

    def _fetch(self, groups: Mapping[int, Sequence[int] | Sequence[TrainTask]]) -> dict[int, list[Any]]:
        """By host id, one reference per state store to its memories of the host's clients (a store lost stops the
        run in one line)."""
        ids = {h: [c if isinstance(c, int) else c.client_id for c in g] for h, g in groups.items()}
        try:
            return self.memories.fetch(ids)
        except Exception as err:
            if not lost(err):
                raise
            raise self.recovery.state_lost("client memories kept by a state store", err) from err

    def _keep(self, groups: Mapping[int, Sequence[TrainTask]], ran: Mapping[int, list[Any]], head: int) -> None:
        """Hand each host's next memories (its returns from ``head`` on, one per store) to the stores."""
        per_store = [[ran[h][head + k] for h in sorted(groups)] for k in range(self.memories.count)]
        self.memories.keep((t.client_id for g in groups.values() for t in g), per_store)

    def _put(self, params: Params) -> list[Any]:
        """The round's global tensors in the object store, one object per parameter-server shard holding that shard's
        tensors (the shard plan first re-dealt when they changed: a model was added or dropped; every reduce call
        names its shard's tensors, since a restarted shard knows only the first plan). A shard is sent its own object
        only, so S shards on S nodes move one model per round between them, not S; a host is sent the list and maps
        every part (``RayClientHost``: zero-copy on its node)."""
        self.shard_of, names = shard_plan(self.shard_of, params, self.num_shards, self.shards)
        if names is not None:
            self._names = names
        arrays = to_numpy(params)
        return [ray.put({n: arrays[n] for n in own}) for own in self._names]

    def _run_and_reduce(
        self,
        keys: Sequence[int],
        step_on: Callable[[int, int], Step],
        params_ref: Any,
        static: bool | None = None,
        hosts_of: Mapping[int, Sequence[int]] | None = None,
    ) -> tuple[dict[int, Any], list[Any], dict[int, list[Any]]]:
        """Run the host calls ``keys`` (``step_on(key, host)``: the call as a ``recovery.Step`` whose first
        ``num_shards`` references are partial sums for the shards and whose probe is the result the driver needs) and
        the shards' reduction of their partial sums in key order: returns each call's fetched result, each shard's
        reduced tensors, and each call's returned references. ``static`` (default: ``backend.dispatch`` is static):
        key ``h`` runs on host ``h``; else the calls are pulled by free hosts (``engine/ray/dispatch.py``; of
        ``hosts_of[key]`` when given).

        Shards are called once every host call has finished (its result fetched): a shard never waits on the
        partial sums of a host that died, and a host call's re-run is all that a host's death costs. Finished partial
        sums lost with their node make the calls run again."""
        fixed = self.dispatch == "static" if static is None else static
        while True:
            ran: dict[int, list[Any]] = {}
            fetched = self._run_calls(keys, step_on, ran, fixed, hosts_of)
            try:
                results = self.recovery.gather(self._reduce_steps(params_ref, ran))
            except InputsLost:
                continue
            return fetched, [results[s] for s in range(self.num_shards)], ran

    def _reduce_steps(self, params_ref: Any, ran: dict[int, list[Any]]) -> dict[int, Step]:
        """Shard ``s`` reduces the host calls' partials for it, in call order (``ran``'s keys: batch index, or host id
        for static shares), whatever order the calls finished in."""

        def submit(s: int) -> list[Any]:
            parts = [ran[k][s] for k in sorted(ran)]
            return [self.shards[s].reduce.remote(params_ref[s], *parts, names=self._names[s])]

        return {
            s: Step(
                f"parameter-server shard {s}",
                partial(submit, s),
                _ready_call(shard),
                recompute_inputs=True,
                doing=f"reducing the partial sums of {len(ran)} host calls",
                **_watched(shard),
            )
            for s, shard in enumerate(self.shards)
        }

    def reduce_uploads(self, params: Params) -> Aggregate:
        """``LocalBackend.reduce_uploads`` on the actors: each host reduces its share of the kept uploads (the
        memories' object-store references resolve on the host, never passing through the driver), the shards merge
        the partials in host order."""
        params_ref = self._put(params)
        ids = sorted(self.memories.held)
        groups = {h: g for h, g in enumerate(uploads_by_host([(c, c) for c in ids], self.num_hosts)) if g}
        fetched = self._fetch({h: cast(list[int], g) for h, g in groups.items()})

        def submit(h: int, client_ids: list[object]) -> list[Any]:
            call = self.hosts[h].reduce_uploads_on.options(num_returns=self.num_shards + 1)
            args = (params_ref, self.shard_of, self.num_shards, client_ids, *fetched[h])
            return list(call.remote(self._run_arg, *args))

        def step_on(k: int, h: int) -> Step:
            held = f"the kept uploads of {len(groups[k])} clients"
            return self._host_step(h, partial(submit, h, groups[k]), f"reducing {held}", held, self.num_shards)

        # a share per host, as before work-conserving dispatch: no training, only a sum over memories of like size
        counts, results, _ = self._run_and_reduce(list(groups), step_on, params_ref, static=True)
        aggregate = assemble_aggregate(results, [])
        return dataclasses.replace(aggregate, num_clients=sum(cast(int, c) for c in counts.values()))

    def evaluate(
        self, params: Params, units: tuple[int, ...] | None = None, model_config: ModelConfig | None = None
    ) -> EvalResult:
        params_ref = ray.put(to_numpy(params))
        batches = eval_batches(self.num_test, self.eval_batch_size, self.num_hosts)

        def submit(h: int, ids: list[int]) -> list[Any]:
            args = (params_ref, ids, self.eval_batch_size, units, model_config)
            return [self.hosts[h].evaluate_on.remote(self._run_arg, *args)]

        steps = {
            h: self._host_step(h, partial(submit, h, b), f"evaluating {len(b)} test batches")
            for h, b in enumerate(batches)
            if b
        }
        stats = self.recovery.gather(steps)
        return combine_eval([stats[h] for h in sorted(stats)])

    def take_faults(self) -> int:
        """Actor failures survived since the last call (``RoundRecord.faults``)."""
        return self.recovery.take_faults()

    def client_states(self) -> dict[int, object]:
        """Every client's memory by client id, all at once (tests; checkpoints use ``client_state_batches``)."""
        states: dict[int, object] = {}
        for batch in self.client_state_batches(max(1, len(self.memories.held))):
            states.update(batch)
        return states

    def client_state_batches(self, size: int) -> Iterator[dict[int, object]]:
        """Every client's memory by client id, ``size`` clients at a time, fetched from the state stores batch by
        batch (checkpoints); a store lost with its node stops the run (``recovery.StateLostError``)."""
        batches = self.memories.batches(size)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except Exception as err:
                if not lost(err):
                    raise
                raise self.recovery.state_lost("client memories gathered for a checkpoint", err) from err
            yield batch

    def load_client_states(self, states: dict[int, object]) -> None:
        self.memories.load(states)

    def clients_per_host(self) -> list[int]:
        """How many clients each host has trained in this run, as the hosts count them (``ClientHost.trained``)."""
        return [int(n) for n in ray.get([h.trained.remote() for h in self.hosts])]

    def node_ids(self) -> list[str]:
        """The Ray node each client host runs on (for placement checks)."""
        return _nodes_of(self.hosts)

    def close(self) -> None:
        """Release the actors and placement group, or park them for the next run (``backend.keep_warm``,
        ``ray_pool.py``); Ray itself stays up for the next run (``ensure_ray``)."""
        self.memories.close()
        self.pool.close(self.keep_warm)
        self.hosts, self.shards = [], []


def _nodes_of(actors: Sequence[Any]) -> list[str]:
    """The Ray node each of ``actors`` runs on."""
    return list(ray.get([a.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id()) for a in actors]))
