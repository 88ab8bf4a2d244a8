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
the head does not. For storage by URI (``s3://``, ``gs://``) the marker goes to the bucket and every node reads it
with its own network and credentials. Nodes that join later (an autoscaler's, or every worker of a sweep started while
the head was alone) are checked where the trials run: each trial checks its node before writing anything
(``check_trial_node``), and a node that cannot reach the storage fails the trial with one line.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rayfl.core.errors import ConfigError
from rayfl.core.files import is_storage_uri
from rayfl.engine.persist.storage import Storage, check_storage, open_storage
from rayfl.tune.fit import NodeType

__all__ = [
    "BOOTSTRAP_CONFIG",
    "PROBE_TIMEOUT_S",
    "SWEEP_MARKER",
    "blind_nodes",
    "check_shared_storage",
    "check_trial_node",
    "launcher_node_types",
    "node_types",
]

PROBE_TIMEOUT_S = 60.0
# a file of the sweep's folder, written before Tune starts: a trial whose node does not see it is not on shared storage
SWEEP_MARKER = "resume.json"
# where `ray up` puts the autoscaler's config on the head (``--autoscaling-config`` in cluster.yaml's start commands)
BOOTSTRAP_CONFIG = Path("~/ray_bootstrap_config.yaml")
_IGNORED = ("memory", "object_store_memory")  # not reserved by bundles; node:<ip> labels are dropped too


def _shape(resources: Mapping[str, float]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in resources.items()
        if k not in _IGNORED and not k.startswith("node:") and not k.startswith("accelerator_type:")
    }


def node_types(avoid: str | None = None) -> list[NodeType]:
    """The alive nodes (node ``avoid``, a reserved head, left out) grouped by shape, plus the autoscaler's node types
    when Ray's GCS holds its cluster config."""
    import ray

    shapes: dict[tuple[tuple[str, float], ...], int] = {}
    for node in ray.nodes():
        if node.get("Alive") and node.get("NodeID") != avoid:
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


def _can_read(where: str, token: str) -> bool:
    """Whether the marker at ``where`` (a path, or a storage URI opened on this node) holds ``token``."""
    try:
        if is_storage_uri(where):
            return open_storage(where).read_text() == token
        return Path(where).read_text(encoding="utf-8") == token
    except (OSError, ValueError):  # ValueError: a ConfigError, storage this node cannot open
        return False


def blind_nodes(folder: Path | Storage, timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """The addresses of the alive nodes (other than this one) that do not see ``folder`` at the same path (or, for
    storage by URI, cannot read it with their own credentials and network), or did not answer within ``timeout_s``;
    empty on a one-node cluster."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    others = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    if not others:
        return []
    token = secrets.token_hex(16)
    name = f".rayfl-shared-probe-{token[:12]}"
    if isinstance(folder, Storage):
        marker = folder.child(name)
        marker.write_bytes(token.encode())
        where = marker.uri
    else:
        (folder / name).write_text(token, encoding="utf-8")
        where = str(folder / name)
    probe = ray.remote(num_cpus=0, max_retries=0)(_can_read)
    try:
        refs = {
            probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                where, token
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
        if isinstance(folder, Storage):
            folder.fs.delete_file(folder.child(name).path)
        else:
            (folder / name).unlink(missing_ok=True)
    return sorted(blind)


def check_shared_storage(folder: Path | Storage, sweep_file: str) -> None:
    """Refuse, in one line, a multi-node sweep whose ``folder`` some alive node does not see (module docstring)."""
    blind = blind_nodes(folder)
    if not blind:
        return
    if isinstance(folder, Storage):
        raise ConfigError(
            f"Ray node(s) {', '.join(blind)} cannot read the sweep's storage {folder.shown} (their network or "
            "credentials), so trials there could not write checkpoints or results; give every node access to it",
            "output_dir",
            file=sweep_file,
        )
    raise ConfigError(
        f"the sweep's folder {folder} is on this node's own disk: Ray node(s) {', '.join(blind)} do not see it, "
        "so trials there could not write checkpoints or results; set output_dir to storage every node mounts at "
        "the same path (NFS, EFS, ...) or to an s3:// or gs:// URI, or run on a single node",
        "output_dir",
        file=sweep_file,
    )


def check_trial_node(trials_dir: str, sweep_marker: str) -> None:
    """In a trial, before it writes anything: the node it runs on reaches the sweep's storage. A node that joined
    after the sweep's own check (an autoscaler's, or every worker of a sweep started while the head was alone) is
    checked here, where the trial runs: a local ``trials_dir`` must show the sweep folder's ``sweep_marker`` file
    (written there before Tune starts), storage by URI must take a write. A one-line ``ConfigError`` otherwise,
    which Tune records as the trial's error."""
    import ray

    node = ray.util.get_node_ip_address() if ray.is_initialized() else "this node"
    if is_storage_uri(trials_dir):
        storage = open_storage(trials_dir)
        try:
            check_storage(storage)
        except ConfigError as err:
            raise ConfigError(f"on Ray node {node}: {err.reason}", "output_dir") from err
        return
    folder = Path(trials_dir).parent
    if not (folder / sweep_marker).is_file():
        raise ConfigError(
            f"Ray node {node} does not see the sweep's folder {folder} (no {sweep_marker} there): it is on another "
            "node's own disk; set output_dir to storage every node mounts at the same path (NFS, EFS, ...) or to an "
            "s3:// or gs:// URI",
            "output_dir",
        )
