"""Whether a sweep's trials can ever be placed: each trial's bundles against the cluster's node types.

Tune waits forever for a placement group that can never be granted, so ``run_sweep`` asks first. A placement group is
granted bundle by bundle onto *single* nodes, so totals are not enough: a bundle of 4 CPUs on a cluster of four 2-CPU
nodes has the CPUs in total and never fits. The check therefore looks at node *types*:

* the nodes alive now, each with its total resources (``ray.nodes()``); and, when Ray's GCS holds the autoscaler's
  cluster config, the node types the autoscaler may launch, with their ``max_count`` (``-1``: no limit);
* every bundle must fit within one node type (every resource it asks for, custom ones included);
* ``STRICT_PACK`` puts all bundles on one node: their sum must fit one node type;
* ``STRICT_SPREAD`` puts each bundle on a different node: there must be that many nodes able to hold one;
* and the trial's total must not exceed what the cluster has, or could have once the autoscaler has launched every
  node it may (so a sweep the autoscaler could serve is not refused because the nodes are not up yet). Alive nodes
  of an autoscaler's type are counted twice there (alive, and in its ``max_count``): the check errs towards
  letting a sweep start, never towards refusing one that could run.

Nothing here imports Ray (``rayfl/tune/cluster.py`` reads the nodes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["NodeType", "fit_problem"]

EPS = 1e-9


@dataclass(frozen=True)
class NodeType:
    """Nodes of one shape: ``count`` alive now, or up to ``count`` launchable (``-1``: unbounded)."""

    resources: Mapping[str, float]
    count: int
    name: str = ""
    launchable: bool = False  # an autoscaler node type (not necessarily running)


def _holds(node: Mapping[str, float], bundle: Mapping[str, float]) -> bool:
    return all(amount <= float(node.get(key, 0.0)) + EPS for key, amount in bundle.items() if amount > 0)


def _plain(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


def _describe(nodes: Sequence[NodeType]) -> str:
    parts = []
    for node in nodes:
        how_many = "any number of" if node.count < 0 else f"{node.count} x"
        label = f" {node.name}" if node.name else ""
        where = " (autoscaler)" if node.launchable else ""
        parts.append(f"{how_many}{label} {_plain(node.resources)}{where}")
    return "; ".join(parts) or "no nodes"


def fit_problem(bundles: Sequence[Mapping[str, float]], nodes: Sequence[NodeType], strategy: str) -> str | None:
    """Why a trial reserving ``bundles`` with placement ``strategy`` can never be placed on ``nodes``, or None."""
    usable = [n for n in nodes if n.count != 0]
    have = f"the cluster's node types are {_describe(usable)}"
    for index, bundle in enumerate(bundles):
        if not any(_holds(n.resources, bundle) for n in usable):
            return f"bundle {index} {_plain(bundle)} fits on no single node: {have}"
    keys = {k for b in bundles for k in b}
    total = {k: sum(float(b.get(k, 0.0)) for b in bundles) for k in keys}
    if strategy == "STRICT_PACK" and not any(_holds(n.resources, total) for n in usable):
        return f"STRICT_PACK puts all {len(bundles)} bundles on one node, {_plain(total)}, larger than any: {have}"
    if strategy == "STRICT_SPREAD":
        able = [n for n in usable if any(_holds(n.resources, b) for b in bundles)]
        most = sum(n.count for n in able)
        if all(n.count >= 0 for n in able) and most < len(bundles):
            return f"STRICT_SPREAD needs {len(bundles)} distinct nodes, the cluster has at most {most}"
    if any(n.count < 0 for n in usable):
        return None  # an unbounded node type: totals can always be met
    for key, need in total.items():
        ceiling = sum(float(n.resources.get(key, 0.0)) * n.count for n in usable)
        if need > ceiling + EPS:
            return (
                f"a trial reserves {need:g} {key} in all, more than the cluster has or can launch ({ceiling:g}): {have}"
            )
    return None
