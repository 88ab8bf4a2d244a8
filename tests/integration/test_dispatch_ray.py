"""Work-conserving dispatch (issue 45, item 1) on real Ray: hosts pull batches of clients as they come free, and the
records stay bit-identical to the in-process run for any number of hosts and any timing, a slowed host included.

Timing is never asserted: the slowed host (``backend.slow_hosts``, the test hook) shows up only in how many clients
each host reports having trained. ``benchmarks/slow_host_dispatch.py`` measures the round times.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rayfl.core.messages import Assignment, Params, TrainTask
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.engine.exec.backend import LocalBackend
from rayfl.engine.ray.backend import RayBackend
from tests.helpers import tiny_config, tiny_image_dataset

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

KEYS = ("train_loss", "test_acc", "test_loss", "clients_run", "bytes_down", "bytes_up", "sim_time_s")


def _run(kind: str, hosts: int, **backend: object) -> RunResult:
    cfg = tiny_config(kind=kind, num_hosts=hosts, cpus_per_host=0.25, **backend)
    cfg = dataclasses.replace(cfg, clients_per_round=8)
    return run_experiment(cfg, write=False, dataset=tiny_image_dataset())


def _assert_identical(a: RunResult, b: RunResult) -> None:
    assert [tuple(getattr(r, k) for k in KEYS) for r in a.records] == [
        tuple(getattr(r, k) for k in KEYS) for r in b.records
    ]
    assert a.state.params.keys() == b.state.params.keys()
    for name in a.state.params:
        assert torch.equal(a.state.params[name], b.state.params[name]), name


def test_pulled_batches_give_the_in_process_records_for_any_host_count() -> None:
    """One client per call (the most interleaving), 1, 2 and 3 hosts, and a static deal: all equal the in-process
    run bit for bit; so does a run whose last host is slowed (its batches finish in another order)."""
    local = _run("local", 2)
    assert local.records[-1].test_acc > 0.0
    for hosts in (1, 2, 3):
        _assert_identical(local, _run("ray", hosts, clients_per_call=1))
    _assert_identical(local, _run("ray", 2, dispatch="static"))
    _assert_identical(local, _run("ray", 3, clients_per_call=1, slow_hosts=(1.0, 1.0, 4.0)))


def _tasks(round_idx: int) -> list[TrainTask]:
    return [TrainTask(client_id=c, round_idx=round_idx, seed=0, lr=0.05, assignment=Assignment()) for c in range(12)]


def _aggregates(backend: LocalBackend | RayBackend, params: Params, rounds: int) -> list[Params]:
    out: list[Params] = []
    for r in range(rounds):
        aggregate, _ = backend.train_and_reduce(_tasks(r), params)
        out.append(aggregate.params)
    return out


def test_a_slow_host_trains_fewer_clients_and_changes_no_number() -> None:
    """Four hosts, the last eight times slower (the test hook): the three fast hosts each report more clients
    trained than it, and every round's aggregate equals the in-process backend's bit for bit."""
    cfg = tiny_config(kind="ray", num_hosts=4, cpus_per_host=0.25, clients_per_call=1, slow_hosts=(1.0, 1.0, 1.0, 8.0))
    setup = build_setup(cfg, tiny_image_dataset())
    ray_backend = build_backend(cfg, setup)
    try:
        assert isinstance(ray_backend, RayBackend)
        got = _aggregates(ray_backend, setup.params, 3)
        counts = ray_backend.clients_per_host()
    finally:
        ray_backend.close()
    assert sum(counts) == 3 * 12
    assert counts[3] < min(counts[:3]), counts
    local_cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, kind="local", slow_hosts=()))
    local = build_backend(local_cfg, build_setup(local_cfg, tiny_image_dataset()))
    assert isinstance(local, LocalBackend)
    want = _aggregates(local, setup.params, 3)
    assert local.clients_per_host() == [9, 9, 9, 9]  # in one process the batches go round the hosts
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
