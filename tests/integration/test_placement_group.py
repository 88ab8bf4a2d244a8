"""Inside a placement group (as in a Ray Tune trial) the backend pins each actor to its bundle of that group."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rayfl.data.federated import FederatedDataset
from rayfl.engine.build import build_backend, build_setup
from rayfl.experiment.schema import ExperimentConfig
from tests.helpers import tiny_config, tiny_image_dataset

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

_BUNDLE = re.compile(r"^CPU_group_(\d+)_([0-9a-f]+)$")  # how Ray names a bundle's share of the group's CPUs


def _where(_actor: object) -> tuple[str | None, dict[str, float], list[int]]:
    """Inside an actor: its placement group, the resources it holds and the bundle indices they come from."""
    import ray
    from ray.util.placement_group import get_current_placement_group

    group = get_current_placement_group()
    raw = ray._private.worker.global_worker.core_worker.resource_ids()  # pg-formatted names carry the bundle index
    bundles = sorted({int(m.group(1)) for name in raw if (m := _BUNDLE.match(name))})
    return (group.id.hex() if group else None, ray.get_runtime_context().get_assigned_resources(), bundles)


def _trial(cfg: ExperimentConfig, dataset: FederatedDataset) -> list[Any]:
    """What a Tune trainable does: build the backend, here only to ask every actor where it runs."""
    import ray

    backend = build_backend(cfg, build_setup(cfg, dataset))
    try:
        return list(ray.get([a.__ray_call__.remote(_where) for a in [*backend.hosts, *backend.shards]]))
    finally:
        backend.close()


def _run_in_group(bundles: list[dict[str, float]], cfg: ExperimentConfig) -> tuple[str, list[Any]]:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group(bundles)
    ray.get(group.ready(), timeout=60)
    try:
        trial = ray.remote(_trial).options(
            num_cpus=bundles[0]["CPU"],
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
            ),
        )
        return group.id.hex(), ray.get(trial.remote(cfg, tiny_image_dataset()), timeout=180)
    finally:
        remove_placement_group(group)


def test_hosts_and_shards_land_in_their_bundles() -> None:
    cfg = tiny_config(kind="ray", num_hosts=2, num_shards=2, cpus_per_host=0.25, cpus_per_shard=0.125)
    bundles = [{"CPU": 0.25}, {"CPU": 0.25}, {"CPU": 0.25}, {"CPU": 0.125}, {"CPU": 0.125}]
    group_id, where = _run_in_group(bundles, cfg)
    assert [w[0] for w in where] == [group_id] * 4
    assert [w[1] for w in where] == [{"CPU": 0.25}, {"CPU": 0.25}, {"CPU": 0.125}, {"CPU": 0.125}]
    assert [w[2] for w in where] == [[1], [2], [3], [4]]


def test_shards_without_cpus_stay_in_the_group_without_a_bundle() -> None:
    cfg = tiny_config(kind="ray", num_hosts=1, num_shards=1, cpus_per_host=0.25, cpus_per_shard=0.0)
    group_id, where = _run_in_group([{"CPU": 0.25}, {"CPU": 0.25}], cfg)
    (host_group, host_holds, host_bundles), (shard_group, shard_holds, shard_bundles) = where
    assert (host_group, host_holds, host_bundles) == (group_id, {"CPU": 0.25}, [1])
    assert (shard_group, shard_holds, shard_bundles) == (group_id, {}, [])


def test_a_group_with_too_few_bundles_is_refused() -> None:
    import ray

    cfg = tiny_config(kind="ray", num_hosts=2, num_shards=1, cpus_per_host=0.25)
    with pytest.raises(ray.exceptions.RayTaskError, match=r"has 2 bundles, but the Ray backend needs 3"):
        _run_in_group([{"CPU": 0.25}, {"CPU": 0.25}], cfg)


def test_pack_reserves_its_own_group_and_gives_it_back() -> None:
    import ray
    from ray.util.placement_group import placement_group_table

    cfg = tiny_config(kind="ray", num_hosts=2, num_shards=1, cpus_per_host=0.25, placement="pack")
    backend = build_backend(cfg, build_setup(cfg, tiny_image_dataset()))
    try:
        where = ray.get([a.__ray_call__.remote(_where) for a in [*backend.hosts, *backend.shards]])
    finally:
        backend.close()
    group_id = where[0][0]
    assert group_id is not None and [w[0] for w in where] == [group_id] * 3
    assert [w[2] for w in where] == [[0], [1], []]  # hosts in bundles 0 and 1; the 0-CPU shard in none
    assert placement_group_table()[group_id]["state"] == "REMOVED"
