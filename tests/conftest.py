from __future__ import annotations

import os
from collections.abc import Iterator

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
