"""Work-conserving dispatch on Ray: a round's batches of clients go to whichever host is free (``backend.dispatch:
pull``; the batches themselves come from ``engine/exec/dispatch.py``).

The driver keeps one call in flight per host. Batches leave the queue in batch order; when a host's call comes back
(``ray.wait`` on every call in flight), that host takes the next batch. One call per host is enough: a call is a
batch of clients, whose training takes far longer than the round trip that fetches the next one, and a second call
queued on a slow host would be one a free host could have run. No number depends on which host ran a batch: the
shards reduce the batches' partial sums in batch order (``RayBackend._reduce_steps``).

In a mixed pool (GPU and CPU hosts) each batch names the hosts of the kind it was dealt to (``engine/exec/
dispatch.py``): a free host takes the first queued batch of its kind, and a host whose kind has none left waits for
the round's end.

Failures are ``Recovery.gather``'s, one call at a time: a call lost with its host (the actor died, was killed as hung
by the watchdog as hung or stuck, or an object it reads went with a process) is counted, the driver waits until Ray's
replacement answers, and the batch goes back to the head of the queue, to be taken by the next free host (the
replacement included); a host call is a pure function of its arguments, so the re-run gives the same bits. Client
memories lost with a node stop the run, as there.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import ray

from rayfl.engine.ray.recovery import Recovery, Step, actor_died, lost
from rayfl.engine.ray.watchdog import Killed

__all__ = ["pull"]

K = TypeVar("K", bound=Hashable)


def pull(
    recovery: Recovery,
    keys: Sequence[K],
    step_on: Callable[[K, int], Step],
    num_hosts: int,
    submitted: dict[K, list[Any]],
    hosts_of: Mapping[K, Sequence[int]] | None = None,
) -> dict[K, Any]:
    """Run the calls ``keys`` (in that order) on ``num_hosts`` hosts, each host taking the next one as soon as its last
    comes back; ``step_on(key, host)`` is the call of ``key`` on ``host``. Returns each call's probe value (key ->
    value, as ``Recovery.gather``); ``submitted`` receives each call's references (of its successful run).
    ``hosts_of``: the hosts that may take each call (a mixed pool's kinds, ``engine/exec/dispatch.py``); a free host
    takes the first queued call it may make. ``None``: any host, any call."""
    queue = deque(keys)
    free = deque(range(num_hosts))  # hosts without a call in flight, lowest id first at the start
    flying: dict[Any, tuple[K, int, Step]] = {}  # probe reference -> (key, host, step)
    results: dict[K, Any] = {}
    watch = recovery.watchdog()
    # the watchdog looks every tick even while calls keep coming back: the other hosts finishing batch after batch
    # must not hide a hung or stuck one
    next_check = time.monotonic()
    while queue or flying:
        while (taken := _take(queue, free, hosts_of)) is not None:
            key, host = taken
            step = step_on(key, host)
            submitted[key] = list(step.submit())
            flying[submitted[key][step.probe]] = (key, host, step)
        done, _ = ray.wait(list(flying), num_returns=1, timeout=watch.tick_s)
        if done:
            key, host, step = flying.pop(done[0])
            if _fetch(recovery, step, done[0], watch.forget(key), results, key):
                queue.appendleft(key)
                del submitted[key]
            free.append(host)
        if watch.tick_s is not None and time.monotonic() >= next_check:
            watch.check({k: s for k, _, s in flying.values()}, [k for k, _, _ in flying.values()])
            next_check = time.monotonic() + watch.tick_s
    return results


def _take(queue: deque[K], free: deque[int], hosts_of: Mapping[K, Sequence[int]] | None) -> tuple[K, int] | None:
    """The next (call, host) pair: the free hosts in the order they came free, each taking the first queued call it
    may make; removed from both queues. ``None`` when no free host may take any queued call."""
    if hosts_of is None:
        return (queue.popleft(), free.popleft()) if queue and free else None
    for host in free:
        for key in queue:
            if host in hosts_of[key]:
                queue.remove(key)
                free.remove(host)
                return key, host
    return None


def _fetch(recovery: Recovery, step: Step, ref: Any, killed: Killed | None, results: dict[K, Any], key: K) -> bool:
    """Fetch a finished call's probe into ``results``; returns whether the call was lost and must run again (after
    its host's replacement answers). An error of the code, or client memories lost with a node, propagate."""
    try:
        results[key] = ray.get(ref)
    except Exception as err:
        if not lost(err):
            raise
        if step.state and not actor_died(err):
            raise recovery.state_lost(f"{step.state} read by {step.label}", err) from err
        recovery.replace(step, err, killed)
        return True
    return False
