"""The Ray instance rayfl runs on: connect to one or start one, and shut down only the one rayfl started.

This module imports Ray and rayfl's config only (no torch), so that the CLI can start Ray before it imports the
driver: ``ensure_ray_importing`` runs ``ray.init`` in the main thread (Ray's driver installs signal handlers there)
while a second thread imports the driver's modules. ``ray.init`` spends most of its seconds waiting for the processes
it spawned to register (its own process is idle meanwhile), and torch's import is the driver's largest start-up cost,
so the two overlap on any machine with a second core.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from rayfl.config import BackendConfig
from rayfl.config_loader import ConfigError

__all__ = ["ensure_ray", "ensure_ray_importing", "gcs_address", "shutdown_ray"]

log = logging.getLogger(__name__)

_started_gcs: str | None = None  # the GCS address of the Ray instance rayfl started in this process, if any


def gcs_address() -> str:
    """The address of the Ray instance this process is connected to (tells one Ray instance from the next)."""
    return str(ray.get_runtime_context().gcs_address)


def ensure_ray(cfg: BackendConfig) -> bool:
    """Connect to (or start) Ray; returns True when this call started it.

    A running Ray is reused, whoever started it: runs in one process (a sweep's trials, a notebook calling
    ``run_experiment`` twice) pay Ray's start once. Backends never shut Ray down; one rayfl started stays up until
    ``shutdown_ray`` or the end of the process (Ray's own exit hook), and one rayfl did not start is never shut down.
    """
    global _started_gcs
    if cfg.address:  # an address named in the config must answer, even when some Ray is connected already
        _probe_address(cfg.address, cfg.start_timeout_s)
    if ray.is_initialized():
        log.debug("reusing the running Ray instance (backend.num_cpus and object_store_mb apply to a new one only)")
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    if cfg.address:
        kwargs["address"] = cfg.address
    else:
        if cfg.num_cpus:
            kwargs["num_cpus"] = cfg.num_cpus
        if cfg.object_store_mb:
            kwargs["object_store_memory"] = cfg.object_store_mb << 20
    ray.init(**kwargs)
    _started_gcs = None if cfg.address else gcs_address()
    return True


def ensure_ray_importing(cfg: BackendConfig, *modules: str) -> tuple[bool, float]:
    """``ensure_ray`` while a second thread imports ``modules``; returns whether Ray was started here and the
    import's wall seconds. An import error is raised after Ray is up (which then stays for the next run)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rayfl-import") as pool:
        importing = pool.submit(_import_all, modules)
        started = ensure_ray(cfg)
        return started, importing.result()


def _import_all(modules: tuple[str, ...]) -> float:
    began = time.perf_counter()
    for name in modules:
        importlib.import_module(name)
    return time.perf_counter() - began


def shutdown_ray() -> bool:
    """Release rayfl's warm actors (``backend.keep_warm``), then shut down the Ray instance rayfl started in this
    process, if it still runs; returns whether it did. A Ray instance rayfl connected to but did not start is left
    alone (its warm actors are released all the same)."""
    global _started_gcs
    pools = sys.modules.get("rayfl.engine.ray_pool")  # not imported: no run has made a pool in this process
    if pools is not None and ray.is_initialized():
        pools.release_warm_pool()
    if _started_gcs is None or not ray.is_initialized() or gcs_address() != _started_gcs:
        return False
    ray.shutdown()
    _started_gcs = None
    return True


def _probe_address(address: str, timeout_s: float) -> None:
    """Fail within ``timeout_s`` when nothing listens at a ``host:port`` cluster address: ``ray.init`` itself keeps
    retrying an unreachable GCS for many minutes. ``auto`` (and addresses without a port) go to Ray as they are."""
    host, sep, port_text = address.removeprefix("ray://").rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host.strip("[]"), int(port_text)), timeout=max(left, 0.05)):
                return
        except OSError as err:
            if time.monotonic() + 0.25 >= deadline:
                raise ConfigError(
                    f"no Ray cluster answers at {address} within {timeout_s:g} s ({err.strerror or err}); start one "
                    "there (ray start --head --port=PORT), fix backend.address, or leave it unset for a local Ray",
                    "backend.address",
                ) from None
            time.sleep(0.25)
