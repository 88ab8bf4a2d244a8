from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.emulated_cluster import EmulatedCluster

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """One real local Ray instance for the whole session (2 CPUs, no dashboard); one a run started is reused."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=512 << 20, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def private_cache_one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test with its own cost-model cache (``RAYFL_CACHE`` under its tmp_path) that trains on one torch thread
    (bit-for-bit comparisons with hand computations); the thread count is put back afterwards."""
    import torch

    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def emulated_cluster() -> Iterator[EmulatedCluster]:
    """A head (0 CPUs: the driver's and GCS's) and two 1-CPU worker nodes, each worker in its own network and mount
    namespace (own IP, own /tmp and working directory), ``shared_dir`` mounted into both (``tests/emulated_cluster.py``;
    for other shapes call ``emulated_cluster(...)`` from there). One per module: starting one takes most of a test's
    time. Skipped in one line where namespaces cannot be made."""
    from tests.emulated_cluster import emulated_cluster as start
    from tests.emulated_cluster import unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with start(workers=2) as cluster:
        yield cluster
