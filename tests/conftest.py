from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.s3_emulator import S3Emulator

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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (the CI command) every test marked ``xdist_group`` must carry its group
    in its node id, which is how pytest-xdist keeps a group on one worker: the multi-node tests (group "cluster")
    start raylets of their own and must not run side by side. pytest 9.2 stopped honouring the way xdist 3.8 renames
    node ids, and the group then silently spread over both workers; this stops such a run at collection instead."""
    if not getattr(config.option, "loadgroup", False) or not hasattr(config, "workerinput"):
        return
    ungrouped = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if ungrouped:
        message = (
            f"{len(ungrouped)} tests marked xdist_group have no group in their node id (e.g. {ungrouped[0]}): "
            f"pytest {pytest.__version__} with this pytest-xdist would spread the group over workers; "
            "install the versions pyproject.toml's test extra names"
        )
        print(f"ERROR: {message}", file=sys.__stderr__)  # a worker's own error reaches the run only as a crash
        raise pytest.UsageError(message)


@pytest.fixture
def s3() -> Iterator[S3Emulator]:
    """An S3 emulator (moto's server) on 127.0.0.1 for the test, with a bucket ``runs-bucket``
    (``tests/s3_emulator.py``)."""
    from tests.s3_emulator import s3_emulator

    with s3_emulator() as emulator:
        emulator.make_bucket("runs-bucket")
        yield emulator
