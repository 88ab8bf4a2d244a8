"""How a round's clients are grouped into host calls, and the order in which their partial sums are reduced.

Two ways (``backend.dispatch``), both pure functions of the round's tasks, the clients' sample counts and the number
of hosts, so the groups, and with them every partial sum, are the same on every backend and at any timing:

* ``static`` (``tasks_by_host``): one group per host, dealt up front by sample count. The round ends when the slowest
  host ends, however long the others wait for it.
* ``pull`` (``pull_batches``, the default): small batches of clients that the backend hands, in batch order, to
  whichever host is free (on Ray, ``engine/ray/dispatch.py``). A host that is slower, or holds larger sub-models,
  simply takes fewer batches, as Flower's actor pool and FedScale's executors do. Which host runs a batch is left to
  timing, but it never shows in the numbers: a client's training depends only on its task (its randomness is derived
  from seed, round and client), and the parameter-server shards merge the batches' partial sums in batch order, not
  in the order they finish or by host.

Across different host counts (another grouping of the same clients) the records agree because the reducer's float64
sums are exact (``core/reducers.py``), as they did for the static deal before.

**Mixed pools** (``backend.gpu_hosts``: some hosts on a GPU, the rest on CPUs). A GPU's kernels give other float32
bits than a CPU's, so a client's update depends on the kind of host that trains it, and letting timing decide the
kind would make the records irreproducible. So the kind is decided first, by a fixed rule (``split_by_kind``): the
round's clients are dealt to the two kinds in proportion to their capacity, GPU hosts counting ``gpu_speedup`` times a
CPU host, by sample count; then each kind's clients are batched and pulled by that kind's hosts only (``static``:
each host's share is sized by its speed in the same way). The records are then a function of the seed and the layout
(which host of a kind trains a client still does not matter); without CUDA both kinds compute on the CPU and the
records equal a uniform pool's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rayfl.config.sections import BackendConfig, is_mixed_pool
from rayfl.core.messages import TrainTask

__all__ = [
    "BATCHES_PER_HOST",
    "Call",
    "HostKinds",
    "call_plan",
    "clients_per_call",
    "host_kinds",
    "pull_batches",
    "split_by_kind",
    "tasks_by_host",
]

# pull with clients_per_call 0: about this many calls per host and round. More calls even out the end of a round
# (the last batch a slow host takes is a smaller share) but send more partial sums to the shards: each batch's
# partial sum is a float64 copy of the tensors its clients covered, and the shards hold them all until they reduce.
BATCHES_PER_HOST = 4


@dataclass(frozen=True)
class HostKinds:
    """A mixed pool's hosts: ``0 .. gpu_hosts - 1`` hold a GPU share, the rest none; ``gpu_speedup``: a GPU host's
    training throughput in CPU hosts (``backend.gpu_speedup``)."""

    num_hosts: int
    gpu_hosts: int
    gpu_speedup: float

    def hosts_of(self, kind: int) -> tuple[int, ...]:
        """The hosts of kind 0 (GPU) or 1 (CPU)."""
        return tuple(range(self.gpu_hosts)) if kind == 0 else tuple(range(self.gpu_hosts, self.num_hosts))

    def speeds(self) -> list[float]:
        """Each host's relative throughput, in host order."""
        return [self.gpu_speedup if h < self.gpu_hosts else 1.0 for h in range(self.num_hosts)]


def host_kinds(backend: BackendConfig) -> HostKinds | None:
    """The kinds of ``backend``'s hosts when its pool mixes GPU and CPU hosts, else ``None`` (one kind)."""
    if not is_mixed_pool(backend):
        return None
    return HostKinds(backend.num_hosts, backend.gpu_hosts, backend.gpu_speedup)


@dataclass(frozen=True)
class Call:
    """One host call of a round: its clients, in id order, and the hosts that may make it."""

    tasks: list[TrainTask]
    hosts: tuple[int, ...]


def _largest_first(tasks: Sequence[TrainTask], sizes: np.ndarray) -> list[TrainTask]:
    return sorted(tasks, key=lambda t: (-int(sizes[t.client_id]), t.client_id))


def tasks_by_host(
    tasks: Sequence[TrainTask], sizes: np.ndarray, num_hosts: int, speeds: Sequence[float] | None = None
) -> list[list[TrainTask]]:
    """Deal a round's tasks to hosts so that their training work is balanced (``backend.dispatch: static``).

    Longest-processing-time first: tasks in decreasing order of sample count (ties by client id) each go to the host
    with the least work so far (ties by host id), work counted in samples divided by the host's speed (``speeds``,
    a mixed pool's ``HostKinds.speeds``; all 1 when ``None``). Deterministic, so a client trains on the same host on
    every backend; where it trains does not change its update (its randomness is derived from its id and the round).
    Every host maps the whole data set from the object store, so any host can train any client.
    """
    speed = list(speeds) if speeds is not None else [1.0] * num_hosts
    groups: list[list[TrainTask]] = [[] for _ in range(num_hosts)]
    load = [0] * num_hosts
    for task in _largest_first(tasks, sizes):
        target = min(range(num_hosts), key=lambda h: (load[h] / speed[h], h))
        groups[target].append(task)
        load[target] += int(sizes[task.client_id])
    return [sorted(g, key=lambda t: t.client_id) for g in groups]


def split_by_kind(
    tasks: Sequence[TrainTask], sizes: np.ndarray, kinds: HostKinds
) -> tuple[list[TrainTask], list[TrainTask]]:
    """A mixed pool's round split into the GPU hosts' clients and the CPU hosts' clients.

    Longest-processing-time first over the two kinds, each kind's capacity its host count times its speed: each task
    (decreasing sample count, ties by client id) goes to the kind that would finish it soonest, counting in samples
    per unit of capacity (ties to the GPU kind). Only sizes and the configured speed decide, never timing."""
    capacity = (kinds.gpu_hosts * kinds.gpu_speedup, float(kinds.num_hosts - kinds.gpu_hosts))
    load = [0, 0]
    parts: tuple[list[TrainTask], list[TrainTask]] = ([], [])
    for task in _largest_first(tasks, sizes):
        size = int(sizes[task.client_id])
        kind = min((0, 1), key=lambda k: ((load[k] + size) / capacity[k], k))
        parts[kind].append(task)
        load[kind] += size
    return parts


def clients_per_call(num_tasks: int, num_hosts: int, configured: int) -> int:
    """Clients in one pulled batch: ``configured``, or for 0 enough for about ``BATCHES_PER_HOST`` calls per host."""
    if configured > 0:
        return configured
    return max(1, -(-num_tasks // (BATCHES_PER_HOST * num_hosts)))


def pull_batches(tasks: Sequence[TrainTask], sizes: np.ndarray, size: int) -> list[list[TrainTask]]:
    """The round's tasks as batches of ``size`` clients, in the order hosts take them (``backend.dispatch: pull``).

    Largest clients first (decreasing sample count, ties by client id), so the batches left for the end of the round
    are the short ones and the last host to finish overshoots the others by little (the longest-processing-time rule
    of ``tasks_by_host``, applied as hosts come free); within a batch, clients in id order, as a host trains them.
    """
    ordered = _largest_first(tasks, sizes)
    return [sorted(ordered[i : i + size], key=lambda t: t.client_id) for i in range(0, len(ordered), size)]


def call_plan(
    tasks: Sequence[TrainTask],
    sizes: np.ndarray,
    num_hosts: int,
    dispatch: Literal["pull", "static"],
    configured: int = 0,
    kinds: HostKinds | None = None,
) -> list[Call]:
    """The round's host calls in reduction order, each with the hosts that may make it: per host (``static``, call
    ``h`` belongs to host ``h``, possibly empty) or per batch (``pull``; ``configured``: ``backend.clients_per_call``),
    any host taking any batch, or in a mixed pool (``kinds``) the GPU hosts' batches first, then the CPU hosts', each
    kind pulling its own."""
    if dispatch == "static":
        speeds = kinds.speeds() if kinds is not None else None
        return [Call(g, (h,)) for h, g in enumerate(tasks_by_host(tasks, sizes, num_hosts, speeds))]
    if kinds is None:
        everyone = tuple(range(num_hosts))
        size = clients_per_call(len(tasks), num_hosts, configured)
        return [Call(g, everyone) for g in pull_batches(tasks, sizes, size)]
    calls: list[Call] = []
    for kind, part in enumerate(split_by_kind(tasks, sizes, kinds)):
        hosts = kinds.hosts_of(kind)
        size = clients_per_call(len(part), len(hosts), configured)
        calls += [Call(g, hosts) for g in pull_batches(part, sizes, size)]
    return calls
