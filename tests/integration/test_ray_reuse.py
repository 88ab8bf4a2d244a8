"""Runs in one process share one Ray instance: the second run does not start Ray again, a Ray that rayfl started
stays up until ``shutdown_ray``, and a Ray the user started is never shut down by rayfl.

The first test runs in a fresh interpreter, since the test session's own Ray (``ray_local``) would hide whether rayfl
starts one; the second uses that session Ray as "the user's".
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayfl.engine.driver import run_experiment
from rayfl.engine.ray.backend import shutdown_ray
from tests.helpers import tiny_config, tiny_image_dataset

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import dataclasses, json
import ray
from rayfl.engine.driver import run_experiment
from rayfl.engine.ray.backend import shutdown_ray
from tests.helpers import tiny_config, tiny_image_dataset

cfg = dataclasses.replace(
    tiny_config(kind="ray", num_hosts=1, num_shards=1, num_cpus=2, object_store_mb=128, cpus_per_host=0.5), rounds=1
)
metrics = lambda r: [(x.train_loss, x.test_acc, x.bytes_up) for x in r.records]
out = {}
first = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
out["up_after_first"] = ray.is_initialized()
gcs = ray.get_runtime_context().gcs_address
second = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
out["same_ray"] = ray.is_initialized() and ray.get_runtime_context().gcs_address == gcs
out["same_records"] = metrics(first) == metrics(second)
out["startup"] = [first.startup_s, second.startup_s]
out["shut_down_ours"] = shutdown_ray() and not ray.is_initialized()
print("REUSE " + json.dumps(out))
"""


@pytest.mark.ray
def test_two_runs_in_one_process_start_ray_once() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("REUSE ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("REUSE "))
    assert out["up_after_first"] and out["same_ray"] and out["same_records"]
    assert out["shut_down_ours"]
    first, second = out["startup"]
    assert {"ray_start_s", "setup_s", "put_s", "backend_s"} <= first.keys() <= second.keys()


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_a_ray_rayfl_did_not_start_is_left_up() -> None:
    """The session's Ray was started by the test fixture, not by rayfl: a run and ``shutdown_ray`` leave it up."""
    import ray

    gcs = ray.get_runtime_context().gcs_address
    cfg = dataclasses.replace(tiny_config(kind="ray", num_hosts=1, num_shards=1, cpus_per_host=0.25), rounds=1)
    result = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    assert result.records and ray.is_initialized() and not shutdown_ray()
    assert ray.is_initialized() and ray.get_runtime_context().gcs_address == gcs
