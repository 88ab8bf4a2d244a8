"""A driver for ``test_head_reserved.py``, run on the emulated cluster's head: where the backend's actors and tasks
land for each ``backend.head`` setting, and a FedorAS run (hosts, shards and search tasks) with its records.

``python head_probe_driver.py ADDRESS SETTING...`` prints one JSON object on its last line: ``head`` (the head's node
id), per setting the nodes of the pool's client hosts and shards, of the state stores and of twelve server tasks, and
``run``: the nodes the FedorAS run's search tasks and shards used, and its round records.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any


def _node_id(_item: int) -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def _nodes_of(actors: list[Any]) -> list[str]:
    import ray

    return list(ray.get([a.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id()) for a in actors]))


def _placements(setting: str) -> dict[str, list[str]]:
    from rayfl.config.sections import BackendConfig
    from rayfl.engine.ray.pool import take_pool
    from rayfl.engine.ray.server_tasks import RayTaskPool
    from rayfl.engine.ray.state_stores import ClientStateStores

    cfg = BackendConfig(kind="ray", num_hosts=2, num_shards=4, cpus_per_host=0.5, head=setting)  # type: ignore[arg-type]
    pool = take_pool(cfg)
    try:
        hosts, shards = _nodes_of(pool.hosts), _nodes_of(pool.shards)
        stores = ClientStateStores(lambda: hosts)
        stores.start()
        try:
            store_nodes = _nodes_of(stores.stores)
        finally:
            stores.close()
    finally:
        pool.release()
    tasks = RayTaskPool(setting).map(_node_id, (), list(range(12)))  # type: ignore[arg-type]
    return {"hosts": hosts, "shards": shards, "stores": store_nodes, "tasks": tasks}


def _fedoras_run(address: str) -> dict[str, Any]:
    """FedorAS's three phases (hosts, shards, state stores and the search's tasks) on the cluster with the default
    ``backend.head: auto``, the in-process run's records beside its own, and the backend's start-up log line."""
    import logging

    from rayfl.engine.driver import run_experiment
    from tests.helpers import tiny_image_dataset
    from tests.helpers_fedoras import fedoras_tiny_config

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("rayfl.engine.ray.backend")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    cfg = fedoras_tiny_config(kind="ray", num_hosts=2, num_shards=3, cpus_per_host=0.5, address=address)
    local_cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, kind="local"))
    local = run_experiment(local_cfg, write=False, dataset=tiny_image_dataset())
    result = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    keys = ("phase", "round_idx", "test_acc", "test_loss", "train_loss")
    return {
        "log": [line for line in lines if line.startswith("ray backend:")],
        "records": [[getattr(r, k) for k in keys] for r in result.records],
        "local_records": [[getattr(r, k) for k in keys] for r in local.records],
    }


def main(argv: list[str]) -> None:
    import ray

    from rayfl.engine.ray.head import head_node

    address, settings = argv[0], argv[1:]
    ray.init(address=address, log_to_driver=False)
    head = head_node(ray.nodes())
    assert head is not None
    out: dict[str, Any] = {"head": head["NodeID"]}
    for setting in settings:
        out[setting] = _placements(setting)
    out["run"] = _fedoras_run(address)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
