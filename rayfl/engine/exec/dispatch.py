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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from rayfl.core.messages import TrainTask

__all__ = ["BATCHES_PER_HOST", "call_groups", "clients_per_call", "pull_batches", "tasks_by_host"]

# pull with clients_per_call 0: about this many calls per host and round. More calls even out the end of a round
# (the last batch a slow host takes is a smaller share) but send more partial sums to the shards: each batch's
# partial sum is a float64 copy of the tensors its clients covered, and the shards hold them all until they reduce.
BATCHES_PER_HOST = 4


def tasks_by_host(tasks: Sequence[TrainTask], sizes: np.ndarray, num_hosts: int) -> list[list[TrainTask]]:
    """Deal a round's tasks to hosts so that their training work is balanced (``backend.dispatch: static``).

    Longest-processing-time first: tasks in decreasing order of sample count (ties by client id) each go to the host
    with the least work so far (ties by host id). Deterministic, so a client trains on the same host on every
    backend; where it trains does not change its update (its randomness is derived from its id and the round).
    Every host maps the whole data set from the object store, so any host can train any client.
    """
    groups: list[list[TrainTask]] = [[] for _ in range(num_hosts)]
    load = [0] * num_hosts
    for task in sorted(tasks, key=lambda t: (-int(sizes[t.client_id]), t.client_id)):
        target = min(range(num_hosts), key=lambda h: (load[h], h))
        groups[target].append(task)
        load[target] += int(sizes[task.client_id])
    return [sorted(g, key=lambda t: t.client_id) for g in groups]


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
    ordered = sorted(tasks, key=lambda t: (-int(sizes[t.client_id]), t.client_id))
    return [sorted(ordered[i : i + size], key=lambda t: t.client_id) for i in range(0, len(ordered), size)]


def call_groups(
    tasks: Sequence[TrainTask],
    sizes: np.ndarray,
    num_hosts: int,
    dispatch: Literal["pull", "static"],
    configured: int = 0,
) -> list[list[TrainTask]]:
    """The round's host calls in reduction order: per host (``static``, group ``h`` belongs to host ``h``, possibly
    empty) or per batch (``pull``, any host may take any batch; ``configured``: ``backend.clients_per_call``)."""
    if dispatch == "static":
        return tasks_by_host(tasks, sizes, num_hosts)
    return pull_batches(tasks, sizes, clients_per_call(len(tasks), num_hosts, configured))
