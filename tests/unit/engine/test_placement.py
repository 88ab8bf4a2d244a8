"""Where the Ray backend's actors go: bundle layout inside a placement group, SPREAD and PACK (pure; no Ray)."""

from __future__ import annotations

import dataclasses

import pytest

from rayfl.config.sections import BackendConfig, host_gpu_shares
from rayfl.engine.ray.placement import ANY_BUNDLE, ActorSlot, layout_in_group, pack_layout, spread_layout
from rayfl.tune.resources import trial_bundles

DRIVER = {"CPU": 0.5}


def test_hosts_then_shards_each_pinned_to_its_bundle() -> None:
    host, shard = {"CPU": 1.0, "GPU": 0.25}, {"CPU": 0.5}
    layout = layout_in_group([DRIVER, host, host, host, shard, shard], 3, 2, 1.0, 0.25, 0.5)
    assert layout.hosts == tuple(ActorSlot(1.0, 0.25, 1 + h) for h in range(3))
    assert layout.shards == (ActorSlot(0.5, 0.0, 4), ActorSlot(0.5, 0.0, 5))


def test_shards_without_cpus_need_no_bundle_and_stay_in_the_group() -> None:
    layout = layout_in_group([DRIVER, {"CPU": 1.0}, {"CPU": 1.0}], 2, 3, 1.0, 0.0, 0.0)
    assert [s.bundle_index for s in layout.hosts] == [1, 2]
    assert layout.shards == (ActorSlot(0.0, 0.0, ANY_BUNDLE),) * 3


def test_a_host_without_configured_cpus_takes_its_bundle() -> None:
    layout = layout_in_group([DRIVER, {"CPU": 0.25}, {"CPU": 0.75}], 2, 1, 0.0, 0.0, 0.0)
    assert [h.num_cpus for h in layout.hosts] == [0.25, 0.75]


def test_too_few_bundles_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"has 3 bundles, but the Ray backend needs 6 \(1 for the driver \+ 3 for "):
        layout_in_group([DRIVER, {"CPU": 1.0}, {"CPU": 1.0}], 3, 2, 1.0, 0.0, 0.5)
    # without shard bundles, 1 + hosts is enough
    layout_in_group([DRIVER, {"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}], 3, 2, 1.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("host_bundle", "match"),
    [({"CPU": 0.5}, "client host 0 needs 1 CPU"), ({"CPU": 1.0}, "client host 0 needs 0.5 GPU")],
)
def test_a_bundle_too_small_for_its_host_is_an_error(host_bundle: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        layout_in_group([DRIVER, host_bundle], 1, 1, 1.0, 0.5, 0.0)


def test_spread_layout_uses_no_group() -> None:
    layout = spread_layout(2, 1, 0.5, 0.25, 0.0)
    assert layout.hosts == (ActorSlot(0.5, 0.25), ActorSlot(0.5, 0.25))
    assert layout.shards == (ActorSlot(0.0),)


def test_pack_layout_reserves_one_bundle_per_actor_that_needs_resources() -> None:
    bundles, layout = pack_layout(2, 2, 1.0, 0.25, 0.0)
    assert bundles == [{"CPU": 1.0, "GPU": 0.25}, {"CPU": 1.0, "GPU": 0.25}]
    assert [h.bundle_index for h in layout.hosts] == [0, 1]
    assert [s.bundle_index for s in layout.shards] == [ANY_BUNDLE, ANY_BUNDLE]
    bundles, layout = pack_layout(1, 1, 0.5, 0.0, 0.25)
    assert bundles == [{"CPU": 0.5}, {"CPU": 0.25}]
    assert layout.shards == (ActorSlot(0.25, 0.0, 1),)


def test_pack_layout_with_nothing_to_reserve_needs_no_group() -> None:
    bundles, layout = pack_layout(2, 1, 0.0, 0.0, 0.0)
    assert bundles == []
    assert all(slot.bundle_index is None for slot in (*layout.hosts, *layout.shards))


def test_a_mixed_pool_reserves_gpus_for_its_first_hosts_only_in_every_layout() -> None:
    """``gpu_hosts: 1`` of 3: host 0 asks for the GPU share, hosts 1 and 2 for CPUs alone, whether spread, packed or
    pinned to a Tune trial's bundles (which then carry no GPU entry for them)."""
    spread = spread_layout(3, 1, 0.5, 0.25, 0.0, gpu_hosts=1)
    assert [h.num_gpus for h in spread.hosts] == [0.25, 0.0, 0.0]
    bundles, packed = pack_layout(3, 1, 0.5, 0.25, 0.0, gpu_hosts=1)
    assert bundles == [{"CPU": 0.5, "GPU": 0.25}, {"CPU": 0.5}, {"CPU": 0.5}]
    assert [h.num_gpus for h in packed.hosts] == [0.25, 0.0, 0.0]
    backend = BackendConfig(kind="ray", num_hosts=3, cpus_per_host=0.5, gpus_per_host=0.25, gpu_hosts=1)
    trial = trial_bundles(backend, driver_cpus=0.5)
    assert trial == [{"CPU": 0.5}, {"CPU": 0.5, "GPU": 0.25}, {"CPU": 0.5}, {"CPU": 0.5}]
    pinned = layout_in_group(trial, 3, 1, 0.5, 0.25, 0.0, gpu_hosts=1)
    assert [(h.num_gpus, h.bundle_index) for h in pinned.hosts] == [(0.25, 1), (0.0, 2), (0.0, 3)]
    assert host_gpu_shares(backend) == (0.25, 0.0, 0.0)
    assert host_gpu_shares(dataclasses.replace(backend, gpu_hosts=0)) == (0.25, 0.25, 0.25)  # 0: every host
