"""Why a run's Ray actors did not start, in one line naming the ``backend`` key to change.

Ray queues an actor that no node can hold ("infeasible") for ever, waiting for an autoscaler that may never come,
so a run that asks for more than the cluster has would wait without end. The pool waits at most
``backend.start_timeout_s`` (``ray_pool.py``) and then asks this module what to say: the first of the run's requests
that no node can hold (CPUs or GPUs per host, CPUs per shard), else the total (the hosts and shards together), each
beside what the cluster has (``ray.cluster_resources()``, and the largest node where one actor must fit on one node).
The answer is a ``ConfigError`` at that key, so ``rayfl run`` prints it in one line at the line or override that set it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ray

from rayfl.config.sections import BackendConfig
from rayfl.core.errors import ConfigError
from rayfl.engine.ray.placement import PoolLayout

__all__ = ["not_started_error"]


def not_started_error(layout: PoolLayout, cfg: BackendConfig, waited: str) -> ConfigError:
    """The error for actors of ``layout`` that did not start (``waited``: what did not happen, and for how long)."""
    cluster = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU", "memory") or k.startswith("GPU")}
    alive = [n for n in ray.nodes() if n.get("Alive")]
    nodes = [n.get("Resources", {}) for n in alive if n.get("NodeID") != layout.avoid]
    if layout.avoid is not None and not nodes:
        return ConfigError(
            f"{waited}: backend.head is {cfg.head!r} and the head (node {layout.avoid}) is reserved, but the cluster "
            "has no other node; start worker nodes (ray start --address=HEAD:PORT), raise backend.start_timeout_s "
            "while an autoscaler adds them, or set backend.head: shared",
            "backend.head",
        )
    if layout.avoid is not None:  # what the nodes that may take the actors have
        cluster = {k: sum(float(n.get(k, 0.0)) for n in nodes) for k in cluster}
    key, asked, has = _first_unfit(layout, cfg, nodes, cluster)
    return ConfigError(
        f"{waited}: {asked}, {has} (ray.cluster_resources(): {_plain(cluster)}); lower it, or raise "
        "backend.start_timeout_s while an autoscaler adds nodes",
        key,
    )


def _first_unfit(
    layout: PoolLayout, cfg: BackendConfig, nodes: Sequence[Mapping[str, float]], cluster: Mapping[str, float]
) -> tuple[str, str, str]:
    """(key, what was asked, what the cluster has) of the first request no node can hold, else of the total."""
    largest = {r: max((float(n.get(r, 0.0)) for n in nodes), default=0.0) for r in ("CPU", "GPU")}
    checks = [
        ("backend.cpus_per_host", "CPU", [s.num_cpus for s in layout.hosts], "per client host"),
        ("backend.gpus_per_host", "GPU", [s.num_gpus for s in layout.hosts], "per client host"),
        ("backend.cpus_per_shard", "CPU", [s.num_cpus for s in layout.shards], "per parameter-server shard"),
    ]
    for key, resource, asks, each in checks:
        need = max(asks, default=0.0)
        if need > largest[resource]:
            return key, f"{need:g} {resource} asked {each}", f"the largest node has {largest[resource]:g}"
    total = {r: sum(getattr(s, f"num_{r.lower()}s") for s in (*layout.hosts, *layout.shards)) for r in ("CPU", "GPU")}
    for resource in ("CPU", "GPU"):
        if total[resource] > float(cluster.get(resource, 0.0)):
            asked = f"{total[resource]:g} {resource} asked by {cfg.num_hosts} client hosts and {cfg.num_shards} shards"
            return "backend.num_hosts", asked, f"the cluster has {float(cluster.get(resource, 0.0)):g}"
    asked = f"{total['CPU']:g} CPU and {total['GPU']:g} GPU asked by the actors"
    return "backend.num_hosts", asked, "which the cluster has in total but not free (other work holds it?)"


def _plain(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"
