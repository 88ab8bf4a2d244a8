"""A trial's placement-group bundles: the layout the Ray backend pins its actors to."""

from __future__ import annotations

import pytest

from rayfl.config.sections import BackendConfig
from rayfl.tune.resources import TrialResources, driver_bundles, trial_backend, trial_bundles


def test_layout_driver_then_one_bundle_per_host() -> None:
    backend = BackendConfig(kind="ray", num_hosts=3, num_shards=2, cpus_per_host=0.5)
    assert trial_bundles(backend, driver_cpus=0.25) == [{"CPU": 0.25}, {"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 0.5}]


def test_shards_that_reserve_cpus_get_the_last_bundles() -> None:
    backend = BackendConfig(kind="ray", num_hosts=2, num_shards=2, cpus_per_host=0.25, cpus_per_shard=0.1)
    bundles = trial_bundles(backend, driver_cpus=0.5)
    assert bundles == [{"CPU": 0.5}, {"CPU": 0.25}, {"CPU": 0.25}, {"CPU": 0.1}, {"CPU": 0.1}]


def test_gpu_entries_only_when_hosts_reserve_gpus() -> None:
    backend = BackendConfig(kind="ray", num_hosts=2, cpus_per_host=1.0, gpus_per_host=0.5)
    assert trial_bundles(backend) == [{"CPU": 0.25}, {"CPU": 1.0, "GPU": 0.5}, {"CPU": 1.0, "GPU": 0.5}]
    assert all(v > 0 for b in trial_bundles(backend) for v in b.values())  # Ray refuses empty or zero entries


def test_in_process_and_search_only_trials_reserve_one_bundle() -> None:
    assert trial_bundles(BackendConfig(kind="local", num_hosts=4), driver_cpus=1.0) == [{"CPU": 1.0}]
    # issue 41: a trial's driver is a Ray worker process, which must not fork: an in-process trial's hosts stay in
    # its driver whatever ``backend.processes`` asks (``auto`` or a count), and it reserves the driver's bundle only
    for asked in ("auto", 3, 8):
        local = trial_backend(BackendConfig(kind="local", num_hosts=4, processes=asked), TrialResources())
        assert local.processes == 1 and trial_bundles(local, driver_cpus=0.25) == [{"CPU": 0.25}], asked
    assert driver_bundles(0.5) == [{"CPU": 0.5}]
    with pytest.raises(ValueError, match="must be > 0"):
        driver_bundles(0.0)


def test_split_the_cluster_becomes_an_explicit_share() -> None:
    backend = BackendConfig(kind="ray", num_hosts=2)
    with pytest.raises(ValueError, match="cpus_per_host is 0"):
        trial_bundles(backend)
    explicit = trial_backend(backend, TrialResources(cpus_per_host=0.2))
    assert explicit.cpus_per_host == 0.2 and trial_bundles(explicit)[1:] == [{"CPU": 0.2}, {"CPU": 0.2}]
    assert trial_backend(BackendConfig(kind="ray", cpus_per_host=0.7), TrialResources()).cpus_per_host == 0.7


def test_the_ray_backend_accepts_the_layout() -> None:
    """Contract with ``rayfl/engine/ray/placement.py``: host h in bundle 1 + h, shard s in bundle 1 + H + s."""
    placement = pytest.importorskip("rayfl.engine.ray.placement")
    for shard_cpus in (0.0, 0.1):
        backend = BackendConfig(kind="ray", num_hosts=3, num_shards=2, cpus_per_host=0.25, cpus_per_shard=shard_cpus)
        bundles = trial_bundles(backend)
        layout = placement.layout_in_group(bundles, 3, 2, 0.25, 0.0, shard_cpus)
        assert [s.bundle_index for s in layout.hosts] == [1, 2, 3]
        assert [s.num_cpus for s in layout.hosts] == [0.25] * 3
        expected = [4, 5] if shard_cpus else [placement.ANY_BUNDLE] * 2
        assert [s.bundle_index for s in layout.shards] == expected
