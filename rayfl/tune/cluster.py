"""What a sweep asks of the Ray cluster before any trial runs: the node types its bundles are checked against
(``fit.py``), and whether the sweep's folder is on storage every node sees.

**Node types.** The alive nodes, grouped by their resources, and the node types an autoscaler may launch: from the
cluster config Ray's GCS holds where the autoscaler reports one, else from ``~/ray_bootstrap_config.yaml``, the
config ``ray up`` writes on the head (its worker types' ``resources`` and ``max_workers``), so a sweep whose GPU
workers are not up yet is not refused.

**Shared storage.** Tune keeps its experiment state and the trials' checkpoints under the sweep's ``tune/`` folder,
and every trial writes its run directory under ``trials/``, from whichever node it runs on. Ray does not copy a
head-local folder to the other nodes: a trial on another node fails at its first checkpoint, and its records land on
that node's own disk, where the table never finds them. So when more than one node is alive, the sweep writes a
marker file with a random token into its folder and asks every other alive node (a zero-CPU task pinned to it) to
read it back at the same path; a node that cannot is named in a one-line refusal. The probe is what the nodes see,
not a guess from the path: an NFS or EFS mount at the same path on every node passes, ``/tmp`` or a home folder on
the head does not. Nodes an autoscaler launches later are not probed (mount the storage in their setup commands).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rayfl.core.errors import ConfigError
from rayfl.tune.fit import NodeType

__all__ = [
    "BOOTSTRAP_CONFIG",
    "PROBE_TIMEOUT_S",
    "blind_nodes",
    "check_shared_storage",
    "launcher_node_types",
    "node_types",
]

PROBE_TIMEOUT_S = 60.0
# where `ray up` puts the autoscaler's config on the head (``--autoscaling-config`` in cluster.yaml's start commands)
BOOTSTRAP_CONFIG = Path("~/ray_bootstrap_config.yaml")
_IGNORED = ("memory", "object_store_memory")  # not reserved by bundles; node:<ip> labels are dropped too


def _shape(resources: Mapping[str, float]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in resources.items()
        if k not in _IGNORED and not k.startswith("node:") and not k.startswith("accelerator_type:")
    }


def node_types() -> list[NodeType]:
    """The alive nodes grouped by shape, plus the autoscaler's node types when Ray's GCS holds its cluster config."""
    import ray

    shapes: dict[tuple[tuple[str, float], ...], int] = {}
    for node in ray.nodes():
        if node.get("Alive"):
            key = tuple(sorted(_shape(node.get("Resources", {})).items()))
            shapes[key] = shapes.get(key, 0) + 1
    types = [NodeType(dict(key), count) for key, count in shapes.items()]
    try:
        config: Any = ray._private.state.state.get_cluster_config()
    except Exception:  # an older or newer Ray without it: the alive nodes are all we know
        config = None
    groups = getattr(config, "node_group_configs", None) or []
    for group in groups:
        resources = _shape(dict(group.resources))
        if resources and group.max_count != 0:
            types.append(NodeType(resources, int(group.max_count), name=str(group.name), launchable=True))
    if not groups and BOOTSTRAP_CONFIG.expanduser().is_file():  # the `ray up` autoscaler's config on the head
        types += launcher_node_types(BOOTSTRAP_CONFIG.expanduser().read_text(encoding="utf-8"))
    return types


def launcher_node_types(text: str) -> list[NodeType]:
    """The worker node types of a cluster-launcher config (``ray up``'s ``available_node_types``, with their
    ``resources`` and ``max_workers``; the head type is counted among the alive nodes); [] when it has none."""
    import yaml

    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return []
    if not isinstance(config, dict) or not isinstance(config.get("available_node_types"), dict):
        return []
    head = config.get("head_node_type")
    types = []
    for name, spec in config["available_node_types"].items():
        if name == head or not isinstance(spec, dict) or not isinstance(spec.get("resources"), dict):
            continue
        count = int(spec.get("max_workers", config.get("max_workers", 0)) or 0)
        resources = _shape({str(k): float(v) for k, v in spec["resources"].items()})
        if resources and count > 0:
            types.append(NodeType(resources, count, name=str(name), launchable=True))
    return types


def _can_read(path: str, token: str) -> bool:
    try:
        return Path(path).read_text(encoding="utf-8") == token
    except OSError:
        return False


def blind_nodes(folder: Path, timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """The addresses of the alive nodes (other than this one) that do not see ``folder`` at the same path, or did
    not answer within ``timeout_s``; empty on a one-node cluster."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    others = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    if not others:
        return []
    token = secrets.token_hex(16)
    marker = folder / f".rayfl-shared-probe-{token[:12]}"
    marker.write_text(token, encoding="utf-8")
    probe = ray.remote(num_cpus=0, max_retries=0)(_can_read)
    try:
        refs = {
            probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                str(marker), token
            ): n["NodeManagerAddress"]
            for n in others
        }
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        blind = [refs[r] for r in refs if r not in ready]
        for ref in ready:
            try:
                seen = bool(ray.get(ref))
            except ray.exceptions.RayError:
                seen = False
            if not seen:
                blind.append(refs[ref])
    finally:
        marker.unlink(missing_ok=True)
    return sorted(blind)


def check_shared_storage(folder: Path, sweep_file: str) -> None:
    """Refuse, in one line, a multi-node sweep whose ``folder`` some alive node does not see (module docstring)."""
    blind = blind_nodes(folder)
    if blind:
        raise ConfigError(
            f"the sweep's folder {folder} is on this node's own disk: Ray node(s) {', '.join(blind)} do not see it, "
            "so trials there could not write checkpoints or results; set output_dir to storage every node mounts at "
            "the same path (NFS, EFS, ...), or run on a single node",
            "output_dir",
            file=sweep_file,
        )
