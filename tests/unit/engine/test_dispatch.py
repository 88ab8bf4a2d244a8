"""How a round's clients become host calls (``engine/exec/dispatch.py``), and that the grouping never changes the
in-process numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfl.core.messages import Assignment, TrainTask
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.exec.backend import LocalBackend
from rayfl.engine.exec.dispatch import (
    HostKinds,
    call_plan,
    clients_per_call,
    host_kinds,
    pull_batches,
    split_by_kind,
    tasks_by_host,
)
from rayfl.experiment.rules import semantic_problems
from tests.helpers import tiny_config, tiny_image_dataset


def _tasks(ids: list[int]) -> list[TrainTask]:
    return [TrainTask(client_id=c, round_idx=0, seed=0, lr=0.1, assignment=Assignment()) for c in ids]


def _ids(groups: list[list[TrainTask]]) -> list[list[int]]:
    return [[t.client_id for t in g] for g in groups]


def test_batches_take_the_largest_clients_first_and_keep_id_order_inside() -> None:
    sizes = np.array([5, 9, 1, 9, 3, 7])
    assert _ids(pull_batches(_tasks([0, 1, 2, 3, 4, 5]), sizes, 2)) == [[1, 3], [0, 5], [2, 4]]
    assert _ids(pull_batches(_tasks([4, 2, 0]), sizes, 5)) == [[0, 2, 4]]
    assert pull_batches([], sizes, 3) == []


def test_auto_batch_size_gives_about_four_calls_per_host() -> None:
    assert clients_per_call(100, 4, 0) == 7  # ceil(100 / 16): 15 calls
    assert clients_per_call(5, 2, 0) == 1
    assert clients_per_call(0, 2, 0) == 1
    assert clients_per_call(100, 4, 3) == 3  # configured


def _groups(*args: object) -> list[list[TrainTask]]:
    """The clients of each call of ``call_plan(*args)``, in reduction order."""
    return [call.tasks for call in call_plan(*args)]  # type: ignore[arg-type]


def test_static_groups_are_the_per_host_deal() -> None:
    sizes = np.array([5, 9, 1, 9, 3, 7])
    tasks = _tasks([0, 1, 2, 3, 4, 5])
    assert _groups(tasks, sizes, 3, "static") == tasks_by_host(tasks, sizes, 3)
    assert _ids(_groups(tasks, sizes, 3, "pull")) == [[1], [3], [5], [0], [4], [2]]  # ceil(6 / 12) = 1 a call
    assert _ids(_groups(tasks, sizes, 1, "pull", 4)) == [[0, 1, 3, 5], [2, 4]]


def test_slow_host_factors_below_one_are_refused() -> None:
    cfg = tiny_config(slow_hosts=(1.0, 0.5))
    assert any(path == ("backend", "slow_hosts") for path, _ in semantic_problems(cfg))
    assert not any(path == ("backend", "slow_hosts") for path, _ in semantic_problems(tiny_config(slow_hosts=(3.0,))))


def test_in_process_aggregate_is_the_same_for_every_grouping() -> None:
    """Pulled batches of 1, 2 or 5 clients on 1 or 3 hosts, and static shares, reduce to the same bits; each host
    reports the clients it trained."""
    results = []
    groupings = ((1, "static", 0), (3, "static", 0), (3, "pull", 1), (2, "pull", 2), (1, "pull", 5))
    for hosts, dispatch, per_call in groupings:
        cfg = tiny_config(kind="local", num_hosts=hosts, dispatch=dispatch, clients_per_call=per_call)
        setup = build_setup(cfg, tiny_image_dataset())
        backend = build_backend(cfg, setup)
        assert isinstance(backend, LocalBackend)
        aggregate, outcomes = backend.train_and_reduce(_tasks(list(range(10))), setup.params)
        assert [o.client_id for o in outcomes] == list(range(10))
        assert sum(backend.clients_per_host()) == 10
        results.append(aggregate.params)
    for other in results[1:]:
        assert all(torch.equal(results[0][k], other[k]) for k in results[0])


def test_a_mixed_pool_deals_clients_to_each_kind_by_capacity() -> None:
    """One GPU host at speed 4 beside two CPU hosts: capacities 4 and 2. Largest first, each client goes to the kind
    whose load per unit of capacity after it is least (ties to the GPU kind); then each kind is batched on its own."""
    sizes = np.array([5, 9, 1, 9, 3, 7])
    kinds = HostKinds(num_hosts=3, gpu_hosts=1, gpu_speedup=4.0)
    gpu, cpu = split_by_kind(_tasks([0, 1, 2, 3, 4, 5]), sizes, kinds)
    # 1 (9): GPU 9/4=2.25 vs CPU 9/2=4.5 -> GPU (9); 3 (9): GPU 18/4=4.5 vs CPU 4.5, tie -> GPU (18);
    # 5 (7): GPU 25/4=6.25 vs CPU 3.5 -> CPU (7); 0 (5): GPU 23/4=5.75 vs CPU 6 -> GPU (23);
    # 4 (3): GPU 26/4=6.5 vs CPU 5 -> CPU (10); 2 (1): GPU 24/4=6 vs CPU 5.5 -> CPU (11)
    assert [t.client_id for t in gpu] == [1, 3, 0] and [t.client_id for t in cpu] == [5, 4, 2]
    plan = call_plan(_tasks([0, 1, 2, 3, 4, 5]), sizes, 3, "pull", 2, kinds)
    assert [(sorted(t.client_id for t in c.tasks), c.hosts) for c in plan] == [
        ([1, 3], (0,)),
        ([0], (0,)),
        ([4, 5], (1, 2)),
        ([2], (1, 2)),
    ]


def test_static_shares_in_a_mixed_pool_are_sized_by_speed() -> None:
    """Equal clients, one host twice as fast as two others: it takes half of them."""
    sizes = np.array([4] * 8)
    groups = tasks_by_host(_tasks(list(range(8))), sizes, 3, [2.0, 1.0, 1.0])
    assert [len(g) for g in groups] == [4, 2, 2]
    kinds = HostKinds(num_hosts=3, gpu_hosts=1, gpu_speedup=2.0)
    plan = call_plan(_tasks(list(range(8))), sizes, 3, "static", 0, kinds)
    assert [c.tasks for c in plan] == groups and [c.hosts for c in plan] == [(0,), (1,), (2,)]


def test_only_a_pool_with_both_kinds_is_mixed() -> None:
    assert host_kinds(tiny_config(num_hosts=3, gpus_per_host=0.5).backend) is None
    assert host_kinds(tiny_config(num_hosts=3, gpus_per_host=0.5, gpu_hosts=3).backend) is None
    assert host_kinds(tiny_config(num_hosts=3, gpus_per_host=0.5, gpu_hosts=1).backend) == HostKinds(3, 1, 4.0)


def test_mixed_pool_rules() -> None:
    def paths(**backend: object) -> list[tuple[object, ...]]:
        return [path for path, _ in semantic_problems(tiny_config(**backend)) if path[0] == "backend"]

    assert ("backend", "gpu_hosts") in paths(num_hosts=2, gpus_per_host=1.0, gpu_hosts=3)
    assert ("backend", "gpu_hosts") in paths(num_hosts=2, gpu_hosts=1)  # no GPU share to reserve
    assert ("backend", "device") in paths(num_hosts=2, gpus_per_host=1.0, gpu_hosts=1, device="cuda")
    assert not paths(num_hosts=2, gpus_per_host=1.0, gpu_hosts=1)
    assert not paths(num_hosts=2, gpus_per_host=1.0, gpu_hosts=2, device="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="without CUDA both kinds of host compute on the CPU")
def test_in_process_mixed_pools_reduce_to_the_uniform_pools_bits() -> None:
    """A mixed pool's calls differ from a uniform pool's (each kind batched on its own), but without CUDA every host
    computes on the CPU, so the aggregate is the same bits; the GPU host trains the clients dealt to its kind."""
    dataset = tiny_image_dataset()
    tasks = _tasks(list(range(10)))
    results, trained = [], []
    for dispatch, gpu_hosts, gpus in (("pull", 0, 0.0), ("pull", 1, 0.5), ("static", 2, 1.0)):
        cfg = tiny_config(kind="local", num_hosts=3, dispatch=dispatch, gpu_hosts=gpu_hosts, gpus_per_host=gpus)
        setup = build_setup(cfg, dataset)
        backend = build_backend(cfg, setup)
        assert isinstance(backend, LocalBackend)
        results.append(backend.train_and_reduce(tasks, setup.params)[0].params)
        trained.append(backend.clients_per_host())
    for other in results[1:]:
        assert all(torch.equal(results[0][k], other[k]) for k in results[0])
    on_gpu, _ = split_by_kind(tasks, dataset.client_sizes(), HostKinds(3, 1, 4.0))
    assert trained[1][0] == len(on_gpu)
