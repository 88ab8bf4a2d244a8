"""A worker node lost on the emulated cluster (issue 32; ``tests/emulated_cluster.py``): a head reserved for the
driver (0 CPUs) and two 1-CPU worker nodes, each with its own IP and its own ``/tmp``.

Every client keeps its last upload (``eval_all_devices``), so each worker node holds client memories in its state
store (``engine/ray/state_stores.py``). The driver is paused in round 1's server update (every host idle), worker 1
is lost (every process in its namespace SIGKILLed, as a pre-empted machine), and the driver goes on once Ray has
marked the node dead. The hosts' replacements fit on worker 0, but the memories kept on worker 1 cannot be
recomputed: the run stops with one line naming the node and the checkpoint to resume from (exit 4). Resumed on what
is left (head and worker 0), it ends with the records of the undisturbed run (the in-process backend, which equals
Ray's bit for bit). The head checks nodes' health every second (``HEALTH``, as the local node-loss tests do), so Ray
marks the lost node dead in about 5 s instead of its default 15-30 s.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.emulated_cluster import emulated_cluster, leftovers, unavailable
from tests.integration.test_faults import load_factor
from tests.integration.test_node_loss import (
    DRIVER,
    HEALTH,
    RUN_TIMEOUT_S,
    _errors,
    _experiment,
    _host_nodes,
    _output,
    _run_dir,
    _undisturbed,
)
from tests.local_cluster import BIN, wait_for_nodes
from tests.resume_cases import assert_same_run

# with pytest -n, one worker runs every multi-node test one after another (each starts several raylets)
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("cluster")]


def test_a_lost_worker_node_with_client_memories_stops_in_one_line_and_resumes(tmp_path: Path) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    # the lost host's replacement must start (import torch) on worker 0 within replace_timeout_s: 30 s on an idle
    # machine, more under load (a suite run beside other work once took longer and gave up waiting for it)
    backend = {"cpus_per_host": 0.5, "replace_timeout_s": 30 * load_factor()}
    config = _experiment(tmp_path, eval_all_devices=True, backend=backend)
    want = _undisturbed(config, tmp_path / "local")
    with emulated_cluster(workers=2, worker_cpus=1, head_cpus=0, system_config=HEALTH) as cluster:
        out = tmp_path / "ray"
        pauses = out / "pauses"
        pauses.mkdir(parents=True)
        env = {**cluster.env, "NODE_LOSS_DIR": str(pauses), "NODE_LOSS_PAUSE": "server:1"}
        command = [sys.executable, str(DRIVER), "-v", "run", str(config), f"backend.address={cluster.address}"]
        proc = subprocess.Popen(
            [*command, f"output_dir={out}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while not (pauses / f"paused.{proc.pid}").exists():
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the run never reached round 1's server update"
                time.sleep(0.1)
            cluster.kill_worker(1)
            killed = time.monotonic()
            wait_for_nodes(cluster.address, cluster.env, 2, timeout_s=RUN_TIMEOUT_S)  # Ray marked it dead
            (pauses / "go").touch()
            stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
            run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        stopped_s = time.monotonic() - killed
        assert run.returncode == 4, _output(run)
        assert len(set(_host_nodes(run.stderr))) == 2  # a host on each worker node: each node kept memories
        assert "Traceback" not in run.stderr, _output(run)
        (line,) = _errors(run.stderr)
        run_dir = _run_dir(out)
        assert line.startswith("rayfl: error: round 1: "), line
        assert "were lost with Ray node" in line and "cannot be recomputed, so the run stops" in line, line
        assert line.endswith(f"after round 0 on a cluster that can hold the run: rayfl run --resume {run_dir}"), line
        resumed = subprocess.run(
            [str(BIN / "rayfl"), "run", "--resume", str(run_dir), f"backend.address={cluster.address}"],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert_same_run(run_dir, want)
        print(f"\nstopped {stopped_s:.1f} s after the node was lost: {line}")
    assert leftovers(cluster) == []
