from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

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
