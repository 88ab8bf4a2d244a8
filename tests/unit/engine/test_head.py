"""``backend.head`` decided from what the nodes advertise (``rayfl/engine/ray/head.py``): a head with no CPU is
reserved under ``auto``, ``reserved`` and ``shared`` override, and the label selector excludes exactly that node."""

from __future__ import annotations

from typing import Any

import pytest

from rayfl.engine.ray.head import HEAD_RESOURCE, head_node, off_node, reserved_head


def _node(node_id: str, cpus: float, head: bool = False, alive: bool = True) -> dict[str, Any]:
    resources = {"CPU": cpus, f"node:10.0.0.{len(node_id)}": 1.0, **({HEAD_RESOURCE: 1.0} if head else {})}
    return {"NodeID": node_id, "Alive": alive, "Resources": resources}


@pytest.mark.parametrize(
    ("setting", "head_cpus", "reserved"),
    [
        ("auto", 0.0, True),  # cluster.yaml's head
        ("auto", 8.0, False),  # a local Ray, a one-machine cluster
        ("reserved", 8.0, True),
        ("reserved", 0.0, True),
        ("shared", 0.0, False),
        ("shared", 8.0, False),
    ],
)
def test_the_head_is_reserved_when_it_advertises_no_cpu_or_when_asked(
    setting: str, head_cpus: float, reserved: bool
) -> None:
    nodes = [_node("w1", 4.0), _node("hd", head_cpus, head=True), _node("w2", 4.0)]
    assert reserved_head(setting, nodes) == ("hd" if reserved else None)  # type: ignore[arg-type]


def test_a_dead_or_unmarked_head_reserves_nothing() -> None:
    assert head_node([_node("hd", 0.0, head=True, alive=False), _node("w1", 4.0)]) is None
    assert reserved_head("reserved", [_node("w1", 4.0)]) is None
    assert reserved_head("auto", []) is None


def test_the_label_selector_excludes_the_node_by_its_id() -> None:
    assert off_node(None) is None
    assert off_node("abc123") == {"ray.io/node-id": "!abc123"}
