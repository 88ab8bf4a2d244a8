"""Client memories on Ray kept by one state-store actor per node that holds client hosts (issue 32, finding 3).

Before, the driver held one ``ObjectRef`` per client: memories under Ray's inline limit (100 KB) sat in the driver's
own heap, larger ones were pinned on the node whose host last trained the client, and a checkpoint ``ray.get``-ed all
of them into the driver at once. Now the driver holds only which clients have a memory (their ids); the memories live
in the heaps of ``StateStore`` actors, client ``c`` in store ``c % K``:

* **One store per node, a fixed client-to-store partition.** Clients reach hosts afresh every round (pulled in batches
  by whichever host is free, or dealt by samples: ``engine/exec/dispatch.py``), so wherever a client's memory lives, a
  round usually reads it from another process; a fixed partition needs no index, never moves a memory between stores,
  and one store per node (``K`` = the nodes the hosts are on when the first memory is kept) spreads them over the
  cluster's memory as the hosts are. A store is apart from the hosts: a host's process that dies (the OOM killer, a
  crash) loses no memory, its replacement reads them as before.
* **Batched.** Per round and host call, one ``take`` call per store with the ids of the host's clients it keeps returns
  them as one object; the host call receives those ``K`` references (never one per client), trains, and returns its
  clients' next memories as one object per store, which the store's ``keep`` call reads directly (the memories never
  pass through the driver; small objects may be inlined through it, one per host and store). ``reduce_uploads``
  (``eval_all_devices``) reads them the same way: ``K`` references per host.
* **Written through to the checkpoint from where they live.** ``batches`` fetches ``size`` clients at a time (one
  ``items`` call per store), so a checkpoint's part files (``persist/checkpoint.py``) are written while the driver
  holds at most one batch.
* **Failures.** A store has ``max_restarts=0``: a restarted one would be empty and the run would go on with clients
  that forgot their state. A store lost (its node gone) stops the run with one line (``StateLostError``) and
  ``rayfl run --resume`` replays from the last checkpoint. Every call the driver waits on is watched
  (``watchdog.py``): a store that answers no ping, or whose count of calls served stands still, for the watchdog's
  timeouts is killed, and the run stops the same way, its line naming the store and the call it was serving. The
  memory monitor kills retriable workers (tasks, and actors that Ray restarts) before non-retriable ones, so the
  stores are among its last victims.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import ray

from rayfl.engine.ray.recovery import StateLostError
from rayfl.engine.ray.watchdog import Watchdog, WatchedCall, wait_watched, watchdog_group

__all__ = ["ClientStateStores", "StateStore", "aligned", "by_store"]


class StateStore:
    """One node's client memories (client id -> memory; ``None`` for a client that trained and keeps nothing)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.memories: dict[int, object] = {}
        self.work_done = 0  # calls served and batches stored: the progress the watchdog reads (``watchdog.py``)

    def ready(self) -> int:
        return self.index

    @watchdog_group
    def progress(self) -> int:
        """The watchdog's ping, answered from a thread of its own beside the call in flight: ``work_done``."""
        return self.work_done

    def take(self, ids: Sequence[int]) -> tuple[int, dict[int, object]]:
        """The memories of ``ids`` (those it has), and their count first (what the driver fetches to know the call
        succeeded, without fetching the memories)."""
        got = {c: self.memories[c] for c in ids if c in self.memories}
        self.work_done += 1
        return len(got), got

    def keep(self, *batches: Mapping[int, object]) -> int:
        """Store each batch's memories (by client id), each copied out of the object store: a view would pin the
        whole object its host returned, stale memories of other clients included. Returns how many it holds."""
        for batch in batches:
            self.memories.update({int(c): copy.deepcopy(m) for c, m in batch.items()})
            self.work_done += 1
        return len(self.memories)

    def load(self, states: Mapping[int, object]) -> int:
        """Replace every memory by ``states`` (a checkpoint's)."""
        self.memories = {int(c): copy.deepcopy(m) for c, m in states.items()}
        self.work_done += 1
        return len(self.memories)

    def items(self, ids: Sequence[int]) -> dict[int, object]:
        """The memories of ``ids`` (checkpoints)."""
        self.work_done += 1
        return {c: self.memories[c] for c in ids if c in self.memories}


def aligned(client_ids: Iterable[int], fetched: Sequence[Mapping[int, object]]) -> list[object | None]:
    """The memories of ``client_ids`` in that order, from the stores' ``take`` results (``None`` where none)."""
    merged: dict[int, object] = {}
    for part in fetched:
        merged.update(part)
    return [merged.get(c) for c in client_ids]


def by_store(client_ids: Sequence[int], memories: Sequence[object], stores: int) -> list[dict[int, object]]:
    """A host's next memories (aligned with ``client_ids``) as one dict per store, client ``c`` to store
    ``c % stores``."""
    out: list[dict[int, object]] = [{} for _ in range(stores)]
    for c, memory in zip(client_ids, memories, strict=True):
        out[c % stores][c] = memory
    return out


class ClientStateStores:
    """The driver's side: which clients have a memory, the store actors (started on first use, one per node of
    ``host_nodes()``), and the calls that move memories between stores and hosts; ``watchdog`` makes the watchdog
    that watches the stores' calls (``Recovery.watchdog``; ``None``: not watched)."""

    def __init__(self, host_nodes: Callable[[], list[str]], watchdog: Callable[[], Watchdog] | None = None) -> None:
        self._host_nodes = host_nodes
        self._watchdog = watchdog
        self.stores: list[Any] = []
        self.held: set[int] = set()
        # the last ``keep`` calls (store index, result), checked before the memories are read again
        self._acks: list[tuple[int, Any]] = []

    @property
    def count(self) -> int:
        """The number of stores (0 before the first memory)."""
        return len(self.stores)

    def start(self) -> None:
        """One store per node the hosts are on, pinned there, if not yet started."""
        if self.stores:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = ray.remote(concurrency_groups={"watchdog": 1})(StateStore)  # pings beside the call in flight
        nodes = sorted(set(self._host_nodes()))
        self.stores = [
            actor.options(
                num_cpus=0,
                max_restarts=0,  # an empty replacement would let clients forget their state: a lost store stops
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(k)
            for k, node in enumerate(nodes)
        ]
        ray.get([s.ready.remote() for s in self.stores])

    def settle(self) -> None:
        """Wait for the ``keep`` calls submitted last (their errors surface here, before memories are read)."""
        acks, self._acks = self._acks, []
        if acks:
            self._get(acks, "storing the round's client memories")

    def _get(self, calls: Sequence[tuple[int, Any]], doing: str) -> list[Any]:
        """``ray.get`` of the calls ``calls`` (store index, reference), each watched while in flight: a store that the
        watchdog kills as hung or stuck stops the run (``StateLostError``, naming it and ``doing``)."""
        if self._watchdog is not None:
            watched = {
                n: (WatchedCall(f"state store {k}", doing, self.stores[k].progress.remote, self._kill(k)), ref)
                for n, (k, ref) in enumerate(calls)
            }
            killed = wait_watched(self._watchdog(), watched)
            if killed:
                n, why = min(killed.items())
                raise StateLostError(
                    f"state store {calls[n][0]} was {why.reason.replace(', so it was killed', '')}; killed, and the "
                    "client memories it kept cannot be recomputed, so the run stops"
                )
        return list(ray.get([ref for _, ref in calls]))

    def _kill(self, k: int) -> Callable[[], None]:
        return partial(ray.kill, self.stores[k], no_restart=True)

    def fetch(self, groups: Mapping[int, Sequence[int]]) -> dict[int, list[Any]]:
        """For each host's client ids (``groups``: host id -> ids), one reference per store to the memories of those
        clients that it keeps (the host call's arguments); waits for every store to answer (a lost store raises
        here, not inside a host call)."""
        if not self.stores:
            return {h: [] for h in groups}
        self.settle()
        k = len(self.stores)
        counts: list[Any] = []
        refs: dict[int, list[Any]] = {}
        for h, client_ids in groups.items():
            ids: list[list[int]] = [[] for _ in self.stores]
            for c in client_ids:
                if c in self.held:
                    ids[c % k].append(c)
            refs[h] = []
            for store, mine in zip(self.stores, ids, strict=True):
                count, ref = store.take.options(num_returns=2).remote(mine)
                counts.append(count)
                refs[h].append(ref)
        self._get([(n % k, c) for n, c in enumerate(counts)], "handing out client memories")
        return refs

    def keep(self, client_ids: Iterable[int], per_store: Sequence[Sequence[Any]]) -> None:
        """After a round: each store reads its part of every host's returned memories (``per_store[k]``: the
        references for store ``k``); ``client_ids`` have memories from now on."""
        self._acks = [(k, self.stores[k].keep.remote(*refs)) for k, refs in enumerate(per_store) if refs]
        self.held.update(client_ids)

    def batches(self, size: int) -> Iterator[dict[int, object]]:
        """Every client's memory, ``size`` clients at a time in client-id order."""
        self.settle()
        ids = sorted(self.held)
        for start in range(0, len(ids), size):
            chunk = ids[start : start + size]
            groups: list[list[int]] = [[] for _ in self.stores]
            for c in chunk:
                groups[c % len(self.stores)].append(c)
            merged: dict[int, object] = {}
            calls = [(k, s.items.remote(g)) for k, (s, g) in enumerate(zip(self.stores, groups, strict=True)) if g]
            for part in self._get(calls, "handing out client memories for a checkpoint"):
                merged.update(part)
            yield {c: merged.get(c) for c in chunk}

    def client_states(self) -> dict[int, object]:
        """Every client's memory at once (tests; checkpoints use ``batches``)."""
        states: dict[int, object] = {}
        for batch in self.batches(max(1, len(self.held))):
            states.update(batch)
        return states

    def load(self, states: Mapping[int, object]) -> None:
        """Replace every memory by ``states`` (resume)."""
        self.settle()
        if not states and not self.stores:
            return
        self.start()
        k = len(self.stores)
        calls = [(i, s.load.remote({c: m for c, m in states.items() if c % k == i})) for i, s in enumerate(self.stores)]
        self._get(calls, "loading client memories from a checkpoint")
        self.held = {int(c) for c in states}

    def close(self) -> None:
        """Kill the stores (the run is over)."""
        for store in self.stores:
            with contextlib.suppress(ray.exceptions.RayError, ValueError):  # already gone (or its Ray is)
                ray.kill(store)
        self.stores, self.held, self._acks = [], set(), []
