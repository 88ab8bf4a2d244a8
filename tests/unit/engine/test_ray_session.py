"""Which Ray a run without ``backend.address`` uses: a cluster that a bare ``ray.init()`` joins (``RAY_ADDRESS``, the
last ``ray start``) is joined without the sizes ``ray.init`` refuses when joining; otherwise a local Ray is started
with ``backend.num_cpus`` and ``object_store_mb``. Ray is not started here: the lookup is Ray's own, from the
environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayfl.config.sections import BackendConfig
from rayfl.engine.ray.session import cluster_a_bare_init_joins, init_kwargs


def test_ray_address_in_the_environment_is_joined_without_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    joins = cluster_a_bare_init_joins()
    assert joins is not None and joins.endswith(":6379")
    cfg = BackendConfig(kind="ray", num_cpus=2, object_store_mb=100)
    assert init_kwargs(cfg, joining=True) == {"include_dashboard": False, "log_to_driver": True}


def test_without_a_cluster_to_join_a_local_ray_gets_the_configured_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    from ray._private.services import find_bootstrap_address

    if find_bootstrap_address(None) is not None:  # Ray's record of the last `ray start` on this machine
        pytest.skip("a `ray start` cluster is recorded on this machine")
    assert cluster_a_bare_init_joins() is None
    cfg = BackendConfig(kind="ray", num_cpus=2, object_store_mb=100)
    kwargs = init_kwargs(cfg, joining=False)
    assert kwargs["num_cpus"] == 2 and kwargs["object_store_memory"] == 100 << 20 and "address" not in kwargs


def test_a_configured_address_is_passed_and_sizes_are_left_to_the_cluster() -> None:
    cfg = BackendConfig(kind="ray", address="auto", num_cpus=2)
    assert init_kwargs(cfg, joining=True) == {"include_dashboard": False, "log_to_driver": True, "address": "auto"}


@pytest.mark.ray
def test_a_local_ray_run_prints_no_token_auth_warning(tmp_path: Path) -> None:
    """Ray's "Token authentication is enabled ..." warning on every run is gone (a real Ray, started by rayfl in a
    fresh process)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    code = (
        "import ray\n"
        "from rayfl.config.sections import BackendConfig\n"
        "from rayfl.engine.ray.session import ensure_ray\n"
        "ensure_ray(BackendConfig(kind='ray', num_cpus=1, object_store_mb=100))\n"
        "print('nodes', len(ray.nodes()))\n"
        "ray.shutdown()\n"
    )
    root = Path(__file__).resolve().parents[3]
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and "nodes 1" in done.stdout, done.stderr
    assert "Token authentication" not in done.stderr + done.stdout
