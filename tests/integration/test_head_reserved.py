"""A reserved head does no work (issue 45, item 4; ``rayfl/engine/ray/head.py``): on the emulated cluster (a head
that advertises 0 CPUs, as ``cluster.yaml``'s, and two 1-CPU workers with their own IPs), the backend's client hosts,
parameter-server shards at 0 CPUs, state stores and server tasks all run on the workers under the default
``backend.head: auto``, and a FedorAS run (hosts, three shards, the search's tasks) gives the in-process records.
``backend.head: shared`` is probed beside it: there Ray may use the head for the work that reserves nothing (it does
not have to, so that is printed, not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.emulated_cluster import REPO_ROOT, emulated_cluster, leftovers, unavailable
from tests.integration.test_faults import load_factor

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("cluster")]

DRIVER = Path(__file__).with_name("head_probe_driver.py")


def test_a_head_that_advertises_no_cpu_runs_no_shard_store_or_server_task() -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with emulated_cluster(workers=2, worker_cpus=1, head_cpus=0) as cluster:
        run = subprocess.run(
            [sys.executable, str(DRIVER), cluster.address, "auto", "shared"],
            env={**cluster.env, "PYTHONPATH": str(REPO_ROOT)},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600 * load_factor(),
            check=False,
        )
        assert run.returncode == 0, f"driver exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
        out = json.loads(run.stdout.strip().splitlines()[-1])
        head = out["head"]
        workers = set(cluster.node_ids) - {head} if cluster.node_ids else None
        reserved = out["auto"]
        for kind in ("hosts", "shards", "stores", "tasks"):
            nodes = reserved[kind]
            assert nodes and head not in nodes, f"{kind} on the reserved head {head}: {nodes}"
            if workers:
                assert set(nodes) <= workers, (kind, nodes, workers)
        assert len(set(reserved["tasks"])) == 2, reserved["tasks"]  # spread over both workers, not packed on one
        shared = out["shared"]
        on_head = {kind: sum(n == head for n in shared[kind]) for kind in ("shards", "tasks")}
        print(f"\nbackend.head: shared puts on the head: {on_head['shards']}/4 shards, {on_head['tasks']}/12 tasks")
        run_out = out["run"]
        (line,) = run_out["log"]
        assert head not in line.split(", head node")[0], line  # no host or shard of the run on the head
        assert line.endswith(f"head node {head} reserved"), line
        assert run_out["records"] == run_out["local_records"]
        assert {r[0] for r in run_out["records"]} == {"supernet", "search", "finetune"}
    assert leftovers(cluster) == []
