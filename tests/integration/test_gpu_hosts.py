"""GPU hosts on logical GPUs: a Ray instance that counts four GPUs on this CPU machine (``ray.init(num_gpus=4)``, as
``ray start --num-gpus 4`` would), so that Ray's GPU bookkeeping runs for real while every host computes on the CPU.

What is checked: hosts at one GPU each get distinct GPUs; half-GPU hosts share a GPU in pairs; a mixed pool (some
hosts with a GPU share, the rest CPU-only) sends each client to the kind of host the fixed split names, and its
records equal the in-process run's bit for bit. On a machine with CUDA the logical count would disagree with the real
devices, so the module skips there (``test_gpu.py`` covers real GPUs).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rayfl.core.messages import Assignment, TrainTask
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.exec.dispatch import host_kinds, split_by_kind
from rayfl.engine.ray.backend import release_warm_pool
from tests.helpers import tiny_config, tiny_image_dataset

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(torch.cuda.is_available(), reason="logical GPUs only; test_gpu.py runs on real ones"),
]

LOGICAL_GPUS = 4


@pytest.fixture(scope="module")
def ray_with_gpus() -> Iterator[None]:
    """A Ray instance of 2 CPUs and 4 logical GPUs for this module; the session's instance, if one runs, is shut
    down first and started again (as ``ray_local`` starts it) afterwards."""
    import ray

    was_running = ray.is_initialized()
    ray.shutdown()
    ray.init(
        num_cpus=2,
        num_gpus=LOGICAL_GPUS,
        include_dashboard=False,
        object_store_memory=512 << 20,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        release_warm_pool()
        ray.shutdown()
        if was_running:
            ray.init(num_cpus=2, include_dashboard=False, object_store_memory=512 << 20, log_to_driver=False)


def _device_and_gpus(host: Any) -> tuple[str, list[str]]:
    """Inside a host: the device it trains on and the GPUs Ray assigned it."""
    import ray

    return str(host.device), [str(g) for g in ray.get_gpu_ids()]


def _tasks(seed: int, count: int) -> list[TrainTask]:
    return [TrainTask(client_id=c, round_idx=0, seed=seed, lr=0.05, assignment=Assignment()) for c in range(count)]


def _hosts_seen(**backend: Any) -> list[tuple[str, list[str]]]:
    import ray

    cfg = tiny_config(kind="ray", cpus_per_host=0.25, **backend)
    ray_backend = build_backend(cfg, build_setup(cfg, tiny_image_dataset()))
    try:
        return list(ray.get([h.__ray_call__.remote(_device_and_gpus) for h in ray_backend.hosts]))  # type: ignore[attr-defined]
    finally:
        ray_backend.close()


@pytest.mark.usefixtures("ray_with_gpus")
def test_hosts_at_one_gpu_each_get_distinct_gpus_and_fall_back_to_the_cpu() -> None:
    seen = _hosts_seen(num_hosts=LOGICAL_GPUS, gpus_per_host=1.0)
    assert all(device == "cpu" for device, _ in seen)  # no CUDA behind the logical GPUs: the CPU, with a warning
    assert all(len(gpus) == 1 for _, gpus in seen)
    assert len({gpus[0] for _, gpus in seen}) == LOGICAL_GPUS


@pytest.mark.usefixtures("ray_with_gpus")
def test_a_mixed_pool_trains_each_client_on_its_kind_and_equals_the_in_process_run() -> None:
    """Hosts 0 and 1 at half a GPU each (which Ray packs onto one GPU), host 2 CPU-only. The round's clients split
    by ``split_by_kind``; the aggregate and then a whole run's records and final model equal the in-process backend's
    (same config, so the same calls) bit for bit."""
    import ray

    dataset = tiny_image_dataset()
    backend_fields: dict[str, Any] = dict(num_hosts=3, gpus_per_host=0.5, gpu_hosts=2, cpus_per_host=0.25)
    cfg = tiny_config(kind="ray", keep_warm=True, **backend_fields)  # the run below reuses these hosts
    local_cfg = tiny_config(kind="local", **backend_fields)
    setup = build_setup(cfg, dataset)
    ray_backend = build_backend(cfg, setup)
    try:
        seen = ray.get([h.__ray_call__.remote(_device_and_gpus) for h in ray_backend.hosts])  # type: ignore[attr-defined]
        tasks = _tasks(cfg.seed, 10)
        aggregate, _ = ray_backend.train_and_reduce(tasks, setup.params)
        per_host = ray_backend.clients_per_host()  # type: ignore[attr-defined]
    finally:
        ray_backend.close()
    gpu_ids = [gpus for _, gpus in seen]
    assert len(gpu_ids[0]) == len(gpu_ids[1]) == 1 and gpu_ids[2] == []
    assert Counter(g for gpus in gpu_ids for g in gpus).most_common(1)[0][1] == 2  # the two halves share one GPU
    kinds = host_kinds(cfg.backend)
    assert kinds is not None
    on_gpu, on_cpu = split_by_kind(tasks, dataset.client_sizes(), kinds)
    assert on_gpu and on_cpu
    assert (per_host[0] + per_host[1], per_host[2]) == (len(on_gpu), len(on_cpu))

    local_setup = build_setup(local_cfg, dataset)
    local_aggregate, _ = build_backend(local_cfg, local_setup).train_and_reduce(tasks, local_setup.params)
    assert all(torch.equal(aggregate.params[k], local_aggregate.params[k]) for k in local_aggregate.params)

    on_ray = run_experiment(dataclasses.replace(cfg, rounds=2), write=False, dataset=dataset)
    in_process = run_experiment(dataclasses.replace(local_cfg, rounds=2), write=False, dataset=dataset)
    keys = ("train_loss", "test_acc", "test_loss", "clients_run", "bytes_down", "bytes_up")
    assert [[getattr(r, k) for k in keys] for r in on_ray.records] == [
        [getattr(r, k) for k in keys] for r in in_process.records
    ]
    assert all(torch.equal(on_ray.state.params[k], in_process.state.params[k]) for k in in_process.state.params)


@pytest.mark.usefixtures("ray_with_gpus")
def test_a_mixed_pool_reserves_gpus_for_its_gpu_hosts_in_pack_and_trial_layouts() -> None:
    """``placement: pack`` and a Tune trial's group (``trial_bundles``): host 0 holds its GPU share from its bundle,
    hosts 1 and 2 hold CPUs alone (spread is the other tests')."""
    import ray

    from rayfl.tune.resources import trial_bundles
    from tests.integration.test_placement_group import _run_in_group, _where

    fields: dict[str, Any] = dict(num_hosts=3, num_shards=1, cpus_per_host=0.25, gpus_per_host=0.5, gpu_hosts=1)
    packed_cfg = tiny_config(kind="ray", placement="pack", **fields)
    packed = build_backend(packed_cfg, build_setup(packed_cfg, tiny_image_dataset()))
    try:
        in_pack = ray.get([h.__ray_call__.remote(_where) for h in packed.hosts])  # type: ignore[attr-defined]
    finally:
        packed.close()
    trial_cfg = tiny_config(kind="ray", **fields)
    _, in_trial = _run_in_group(trial_bundles(trial_cfg.backend, driver_cpus=0.25), trial_cfg)
    for where in (in_pack, in_trial[:3]):
        assert [w[1].get("GPU", 0.0) for w in where] == [0.5, 0.0, 0.0]
        assert all(w[1]["CPU"] == 0.25 for w in where)
