"""A real two-node Ray cluster on this machine: `rayfl run` against it spreads the client hosts over both nodes and
gives the same numbers as the in-process backend.

The cluster is two ``ray start --block`` processes (a 1-CPU head and a 1-CPU worker node) with private temp dirs and
``RAY_AUTH_MODE`` exported for every process; it is torn down by SIGTERM to those two PIDs (never ``ray stop``, which
would end every Ray on the machine), and the test checks that none of its processes is left.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from tests.local_cluster import BIN, OBJECT_STORE_BYTES, cluster_env, free_port, processes_of, stop, wait_for_nodes
from tests.resume_cases import WALL_CLOCK_COLUMNS  # measured per run, so they differ between any two runs

# with pytest -n, one worker runs every multi-node test one after another (each starts several raylets)
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("cluster")]

EXPERIMENT = {
    "name": "two-node",
    "seed": 0,
    "rounds": 2,
    "clients_per_round": 4,
    "eval_every": 1,
    "data": {"name": "synthetic", "num_clients": 8, "synthetic_samples": 16},
    "model": {"name": "cnn", "channels": [4, 8]},
    "train": {"lr": 0.05, "batch_size": 8, "eval_batch_size": 250},
    # two 1-CPU hosts on two 1-CPU nodes: one per node whatever the scheduler prefers; SPREAD would do it anyway
    "backend": {"kind": "ray", "num_hosts": 2, "num_shards": 1, "cpus_per_host": 1.0, "torch_threads": 1},
}


@dataclass(frozen=True)
class Cluster:
    address: str
    node_ids: frozenset[str]
    env: dict[str, str]


@pytest.fixture(scope="module")  # one cluster for the module's tests: starting one takes most of their time
def two_node_cluster() -> Iterator[Cluster]:
    root = tempfile.mkdtemp(prefix="rayfl2n_")  # short: Ray's socket paths live under it
    env = cluster_env()
    port = free_port()
    address = f"127.0.0.1:{port}"
    head_dir, node_dir = [f"--temp-dir={root}/head"], [f"--temp-dir={root}/node"]
    common = ["--num-cpus=1", "--num-gpus=0", f"--object-store-memory={OBJECT_STORE_BYTES}", "--block"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    str(BIN / "ray"),
                    "start",
                    "--head",
                    f"--port={port}",
                    "--include-dashboard=false",
                    *head_dir,
                    *common,
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        procs.append(
            subprocess.Popen(
                [str(BIN / "ray"), "start", f"--address={address}", *node_dir, *common],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        yield Cluster(address, wait_for_nodes(address, env, 2), env)
    finally:
        for proc in reversed(procs):  # the worker node first, then the head
            stop(proc)
        deadline = time.monotonic() + 15
        while processes_of(root) and time.monotonic() < deadline:
            time.sleep(0.5)
        leftovers = processes_of(root)
        for proc in leftovers:  # ours by their temp root; ended only so that a failure does not leak them
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)
        assert not leftovers, f"processes of the test cluster outlived its teardown: {[p.pid for p in leftovers]}"


def _run_dir(output_dir: Path) -> Path:
    (run_dir,) = [p for p in output_dir.iterdir() if p.is_dir()]
    return run_dir


def _deterministic(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in WALL_CLOCK_COLUMNS if c in frame.columns]).reset_index(drop=True)


def test_hosts_spread_over_both_nodes_with_in_process_numbers(two_node_cluster: Cluster, tmp_path: Path) -> None:
    config = tmp_path / "two_node.yaml"
    config.write_text(yaml.safe_dump(EXPERIMENT))
    on_ray, in_process = tmp_path / "ray", tmp_path / "local"
    overrides = [f"backend.address={two_node_cluster.address}", f"output_dir={on_ray}"]
    began = time.monotonic()
    run = subprocess.run(
        [str(BIN / "rayfl"), "-v", "run", str(config), *overrides],
        env=two_node_cluster.env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert time.monotonic() - began < 120
    # the hosts' nodes as RayBackend.node_ids() reported them in the driver's log
    match = re.search(r"client hosts on nodes ([0-9a-f]+(?:,[0-9a-f]+)*)", run.stderr)
    assert match is not None, run.stderr[-3000:]
    host_nodes = match.group(1).split(",")
    assert len(host_nodes) == 2 and set(host_nodes) == two_node_cluster.node_ids

    cfg = load_config(config, ["backend.kind=local", f"output_dir={in_process}"])
    run_experiment(cfg)
    for table in ("rounds.parquet", "clients.parquet"):
        ray_rows = _deterministic(pd.read_parquet(_run_dir(on_ray) / table))
        local_rows = _deterministic(pd.read_parquet(_run_dir(in_process) / table))
        assert len(ray_rows) > 0
        pd.testing.assert_frame_equal(ray_rows, local_rows, check_exact=True)
    rounds = pd.read_parquet(_run_dir(on_ray) / "rounds.parquet")
    assert rounds["clients_run"].tolist() == [4, 4] and rounds["test_acc"].notna().all()


def test_server_tasks_spread_over_both_nodes(two_node_cluster: Cluster) -> None:
    """FedorAS's search evaluates candidates as ``RayTaskPool`` tasks: they reserve no CPU, and ask for SPREAD so
    that they use every node, not only the driver's (a driver on the head node, 8 items)."""
    script = (
        "import sys, ray\n"
        "from rayfl.engine.ray.server_tasks import RayTaskPool\n"
        "def node_of(scale, item):\n"
        "    import time\n"
        "    time.sleep(0.2)\n"
        "    return ray.get_runtime_context().get_node_id(), scale * item\n"
        "ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "out = RayTaskPool().map(node_of, (3,), list(range(8)))\n"
        "print('VALUES', *[v for _, v in out])\n"
        "print('NODES', *sorted({n for n, _ in out}))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, two_node_cluster.address],
        env=two_node_cluster.env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    values = re.search(r"^VALUES (.+)$", run.stdout, re.MULTILINE)
    nodes = re.search(r"^NODES (.+)$", run.stdout, re.MULTILINE)
    assert values is not None and nodes is not None, run.stdout[-3000:]
    assert values.group(1).split() == [str(3 * i) for i in range(8)]  # in item order
    assert set(nodes.group(1).split()) == two_node_cluster.node_ids
