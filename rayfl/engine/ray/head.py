"""Whether the Ray head node takes any of a run's work (``backend.head``), and the selector that keeps work off it.

A cluster's head runs the driver and Ray's own services (GCS, dashboard, autoscaler); ``cluster.yaml`` and
``cluster-onprem.yaml`` reserve it by advertising no CPU. That keeps actors and tasks that reserve CPUs off it, but
Ray places work that reserves nothing anywhere, the head included (measured on Ray 2.60 with a 0-CPU head and two
1-CPU workers: 3 of 9 zero-CPU ``SPREAD`` tasks ran on the head). The backend starts such work: parameter-server
shards at ``cpus_per_shard: 0`` (the default), state stores (pinned to the hosts' nodes, so they follow the hosts) and
the server's parallel tasks (FedorAS's candidate evaluations). On a reserved head each of them carries a label
selector that excludes the head's node id (Ray labels every node with ``ray.io/node-id``), so Ray places it on another
node and, while none is up, queues it as it does work that fits nowhere yet.

``backend.head``:

* ``auto`` (default): reserved when the head advertises no CPU (``cluster.yaml``'s head, ``ray start --head
  --num-cpus=0``), shared otherwise (a local Ray, a one-machine cluster).
* ``reserved``: nothing the backend starts runs on the head, whatever it advertises; a head with CPUs keeps them for
  the driver's own threads (``distill.workers``, ``backend.server_threads``).
* ``shared``: Ray places everything where it fits, the head included.

The driver's own server work (aggregation's last step, distillation, evaluation, search bookkeeping) runs in the driver
process, wherever the driver runs: on a reserved head that is by design.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

__all__ = ["HEAD_RESOURCE", "NODE_ID_LABEL", "HeadSetting", "head_node", "off_node", "reserved_head"]

HeadSetting = Literal["auto", "reserved", "shared"]

HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives the head node alone
NODE_ID_LABEL = "ray.io/node-id"  # the label Ray puts on every node: its node id


def head_node(nodes: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The head's entry among ``ray.nodes()``-shaped ``nodes`` (alive ones only), or None when none is marked."""
    for node in nodes:
        if node.get("Alive") and HEAD_RESOURCE in node.get("Resources", {}):
            return node
    return None


def reserved_head(setting: HeadSetting, nodes: Sequence[Mapping[str, Any]] | None = None) -> str | None:
    """The head's node id when the backend must keep its work off it (``setting``, see the module docstring), else
    None. ``nodes`` defaults to ``ray.nodes()`` of the connected Ray."""
    if setting == "shared":
        return None
    if nodes is None:
        import ray

        nodes = ray.nodes()
    head = head_node(nodes)
    if head is None:
        return None
    if setting == "auto" and float(head.get("Resources", {}).get("CPU", 0.0)) > 0:
        return None
    return str(head["NodeID"])


def off_node(node_id: str | None) -> dict[str, str] | None:
    """Ray's ``label_selector`` that keeps an actor or task off node ``node_id`` (None: no constraint)."""
    return None if node_id is None else {NODE_ID_LABEL: f"!{node_id}"}
