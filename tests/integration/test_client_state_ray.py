"""Per-client state follows its client across rounds whatever the host layout: in-process vs Ray, 1 vs 3 hosts,
bit for bit; ``client_states`` / ``load_client_states`` round-trip (checkpoints). Real Ray, real training."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from rayfl.core.messages import Assignment, ClientUpdate, Params, TrainTask
from rayfl.engine.build import bind_algorithm, build_backend, build_clock, build_setup
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.engine.exec.backend import Backend
from rayfl.engine.exec.client_state import ClientMemory
from rayfl.fl.api.client import ClientContext
from rayfl.fl.methods.fedavg.algorithm import FedAvg
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedrescue.config import FedResCuEConfig
from tests.helpers import tiny_config, tiny_image_dataset
from tests.unit.fl.test_fedrescue import CAPACITY_MEMORY, _cfg

ROUNDS = ((0, 1, 2, 3), (1, 2, 4), (0, 1, 5, 6), (1, 3, 6))  # clients per round; client 1 trains every round


class CountingFedAvg(FedAvg):
    """FedAvg whose clients remember how often they trained and slow down with it (state changes the numbers)."""

    keeps_client_state = True

    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        seen = int(ctx.memory or 0)  # type: ignore[call-overload]
        slower = dataclasses.replace(ctx, task=dataclasses.replace(ctx.task, lr=ctx.task.lr / (1 + seen)))
        update = super().local_train(slower, x, y)
        return dataclasses.replace(update, client_state=seen + 1)


def _backend(kind: str, hosts: int) -> tuple[Backend, Params]:
    cfg = tiny_config(kind=kind, num_hosts=hosts, cpus_per_host=0.25)
    cfg = dataclasses.replace(cfg, algorithm=FedAvgConfig())
    setup = build_setup(cfg, tiny_image_dataset())
    setup = dataclasses.replace(setup, algorithm=CountingFedAvg(cfg.algorithm, cfg.train))
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    return build_backend(cfg, setup), setup.params


def _rounds(backend: Backend, params: Params, rounds: Any, start: int = 0) -> Params:
    for r, clients in enumerate(rounds, start=start):
        tasks = [TrainTask(client_id=c, round_idx=r, seed=0, lr=0.05, assignment=Assignment()) for c in clients]
        aggregate, _ = backend.train_and_reduce(tasks, params)
        params = aggregate.params
    return params


def _equal(a: Params, b: Params) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_client_state_follows_clients_on_ray_with_3_and_1_hosts_and_round_trips() -> None:
    """In-process (1 host) for four rounds; on Ray with 3 hosts two rounds, then the memories go through
    ``client_states`` / ``load_client_states`` (a checkpoint) into the same backend and into a fresh 1-host one; both
    finish the run bit-identical to in-process, with every client's count right."""
    local, params = _backend("local", 1)
    try:
        want = _rounds(local, params, ROUNDS)
        want_states = local.client_states()
    finally:
        local.close()
    seen = {c: sum(c in r for r in ROUNDS) for c in range(7)}
    assert {c: m.algo_state for c, m in want_states.items() if isinstance(m, ClientMemory)} == seen
    three, params = _backend("ray", 3)
    try:
        half = _rounds(three, params, ROUNDS[:2])
        saved = three.client_states()
        three.load_client_states(saved)
        assert _equal(_rounds(three, half, ROUNDS[2:], start=2), want)
        assert three.client_states() == want_states
    finally:
        three.close()
    one, _ = _backend("ray", 1)
    try:
        one.load_client_states(saved)
        assert one.client_states() == saved
        assert _equal(_rounds(one, half, ROUNDS[2:], start=2), want)
        assert one.client_states() == want_states
    finally:
        one.close()


def _fedrescue(kind: str, hosts: int) -> RunResult:
    cfg = _cfg(FedResCuEConfig(), memory=CAPACITY_MEMORY)
    cfg = dataclasses.replace(cfg, rounds=4, backend=dataclasses.replace(cfg.backend, kind=kind, num_hosts=hosts))
    cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, cpus_per_host=0.25))
    return run_experiment(cfg, write=False, dataset=tiny_image_dataset())


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_fedrescue_with_faulty_links_and_padding_is_identical_in_process_and_on_ray() -> None:
    """Padding reads each client's memory: 1 in-process host and 3 Ray hosts give the same run bit for bit."""
    keys = ("train_loss", "test_acc", "test_loss", "bytes_down", "bytes_up", "clients_failed")
    local = _fedrescue("local", 1)
    assert any(r.clients_failed for r in local.records)  # the links did lose whole uploads
    other = _fedrescue("ray", 3)
    assert [[getattr(r, k) for k in keys] for r in other.records] == [
        [getattr(r, k) for k in keys] for r in local.records
    ]
    assert _equal(other.state.params, local.state.params)
