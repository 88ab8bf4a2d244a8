"""Which Ray a run without ``backend.address`` uses: a cluster that a bare ``ray.init()`` joins (``RAY_ADDRESS``, the
last ``ray start``) is joined without the sizes ``ray.init`` refuses when joining; otherwise a local Ray is started
with ``backend.num_cpus`` and ``object_store_mb``. Ray is not started here: the lookup is Ray's own, from the
environment."""

from __future__ import annotations

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
