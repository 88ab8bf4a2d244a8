"""Server-side parallel work for phases that run on the server (FedorAS's search): a map over items.

``TaskPool.map(fn, shared, items)`` returns ``[fn(*shared, item) for item in items]`` in item order. The in-process
pool runs them one after another; the Ray pool runs each item as a Ray task, with ``shared`` put into the object store
once. ``fn`` must be a pure, module-level function (it is pickled to Ray workers), so both pools give the same results.
Server phases run while the client hosts are idle, so the tasks reserve no CPU of their own (a reservation could
never be granted while the hosts hold every CPU of a small cluster); their parallelism is the number of items. With
no reservation the scheduler sees no reason to leave the driver's node, so the tasks ask for the ``SPREAD`` strategy:
on a cluster they go round the nodes (measured in ``tests/integration/test_two_node.py``), on one node nothing changes.
On a reserved head (``backend.head``, ``head.py``) they go round the other nodes only.
Where a task runs does not change what it returns (the functions are pure and fix their own thread count).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from rayfl.engine.ray.head import HeadSetting, off_node, reserved_head

__all__ = ["RayTaskPool"]

T = TypeVar("T")


class RayTaskPool:
    """One Ray task per item on the running Ray instance (the Ray backend's), spread over its nodes (off the head when
    ``head`` reserves it: decided on the first ``map``, when Ray is up)."""

    def __init__(self, head: HeadSetting = "auto") -> None:
        self.head = head
        self._where: dict[str, Any] | None = None

    def map(self, fn: Callable[..., T], shared: Sequence[Any], items: Sequence[Any]) -> list[T]:
        import ray

        if self._where is None:
            keep_off = off_node(reserved_head(self.head))
            self._where = {
                "scheduling_strategy": "SPREAD",
                **({} if keep_off is None else {"label_selector": keep_off}),
            }
        remote = ray.remote(num_cpus=0, **self._where)(fn)
        refs = [ray.put(s) for s in shared]
        return list(ray.get([remote.remote(*refs, item) for item in items]))
