"""How a round's clients become host calls (``engine/exec/dispatch.py``), and that the grouping never changes the
in-process numbers."""

from __future__ import annotations

import numpy as np
import torch

from rayfl.core.messages import Assignment, TrainTask
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.exec.backend import LocalBackend
from rayfl.engine.exec.dispatch import call_groups, clients_per_call, pull_batches, tasks_by_host
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


def test_static_groups_are_the_per_host_deal() -> None:
    sizes = np.array([5, 9, 1, 9, 3, 7])
    tasks = _tasks([0, 1, 2, 3, 4, 5])
    assert call_groups(tasks, sizes, 3, "static") == tasks_by_host(tasks, sizes, 3)
    assert _ids(call_groups(tasks, sizes, 3, "pull")) == [[1], [3], [5], [0], [4], [2]]  # ceil(6 / 12) = 1 a call
    assert _ids(call_groups(tasks, sizes, 1, "pull", 4)) == [[0, 1, 3, 5], [2, 4]]


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
