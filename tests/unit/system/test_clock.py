"""The simulated clock: budgets, fits, the timeline of a round, failures, and independence from host speed."""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np
import pytest

from rayfl.config.sections import ResourceConfig, SystemConfig
from rayfl.core.messages import Assignment
from rayfl.engine.build import build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.fl.methods.fedavg.algorithm import FedAvg
from rayfl.system.clock import ClientPlan, SimClock
from rayfl.system.resources import Log, TraceReplay
from tests.helpers import tiny_config, tiny_image_dataset


def clock_for(system: SystemConfig) -> tuple[SimClock, float, float]:
    """A clock for the tiny CNN, with the model's memory need and its bytes each way."""
    cfg = dataclasses.replace(tiny_config(kind="local"), system=system)
    setup = build_setup(cfg, tiny_image_dataset())
    clock = build_clock(cfg, setup)
    costs = clock.oracle.costs([Assignment()])
    return clock, float(costs.memory[0]), float(costs.bytes_down[0])


def plan_one(clock: SimClock, clients: list[int], round_idx: int = 0):  # type: ignore[no-untyped-def]
    views = clock.check_in(round_idx, np.array(clients), [20] * len(clients))
    return clock.plan(round_idx, views, {c: Assignment() for c in clients})


def test_budgets_decide_who_fits() -> None:
    _, need, nbytes = clock_for(SystemConfig())
    mib = 2.0**20
    system = SystemConfig(
        memory=ResourceConfig(source="levels", values=(need / mib * 0.5, need / mib * 2)),
        bandwidth_down=ResourceConfig(source="constant", low=1.0),  # 1 Mbit/s
        comm_limit_s=60.0,
    )
    clock, _, _ = clock_for(system)
    plan = plan_one(clock, [0, 1, 2, 3])
    assert sorted(str(f) for f in plan.failure) == ["None", "None", "memory", "memory"]  # half below the need
    np.testing.assert_allclose(plan.bandwidth_budget, 60 * 1e6 / 8)  # bytes movable in 60 s at 1 Mbit/s
    np.testing.assert_allclose(plan.bandwidth_util, 2 * nbytes / (60 * 1e6 / 8))
    np.testing.assert_allclose(plan.download_s, 8 * nbytes / 1e6)  # the exact transfer time at 1 Mbit/s
    tight = dataclasses.replace(system, comm_limit_s=0.5 * 16 * nbytes / 1e6)  # half the time both ways need
    clock, _, _ = clock_for(tight)
    assert set(plan_one(clock, [0, 1, 2, 3]).failure) == {"memory", "bandwidth"}


def test_compute_budgets_fail_clients_whose_round_needs_more_flops() -> None:
    """``compute_limit_s``: the budget is speed x limit in FLOPs; the need is 3 x forward FLOPs x samples."""
    clock, _, _ = clock_for(SystemConfig())
    flops = float(clock.oracle.costs([Assignment()]).train_flops_per_sample[0]) * 20  # 20 samples, one epoch
    assert all(np.isinf(v.compute_budget) for v in clock.check_in(0, np.array([0]), [20]))  # no limit: no budget
    speeds = (0.5 * flops / 1e9, 2.0 * flops / 1e9)  # GFLOP/s: half and twice what one second of training needs
    clock, _, _ = clock_for(SystemConfig(compute=ResourceConfig(source="levels", values=speeds), compute_limit_s=1.0))
    views = clock.check_in(0, np.array([0, 1, 2, 3]), [20] * 4)
    assert sorted(v.compute_budget for v in views) == pytest.approx([0.5 * flops] * 2 + [2.0 * flops] * 2)
    plan = clock.plan(0, views, {c: Assignment() for c in range(4)})
    assert sorted(str(f) for f in plan.failure) == ["None", "None", "compute", "compute"]
    np.testing.assert_allclose(plan.train_flops, flops)


def test_a_memory_dip_during_training_fails_the_client() -> None:
    clock, need, _nbytes = clock_for(SystemConfig(bandwidth_down=ResourceConfig(source="constant", low=1.0)))
    plan = plan_one(clock, [0])
    down, comp = float(plan.download_s[0]), float(plan.compute_s[0])
    assert comp > 0
    ok, low = 2 * need, 0.5 * need
    mid = down + comp / 2  # the dip happens while it trains
    dip = Log(np.array([0.0, mid, mid + 1e-3, 1e6]), np.array([ok, low, ok, ok]))
    after = Log(np.array([0.0, down + comp + 1.0, 1e6]), np.array([ok, low, ok]))
    clock.memory = TraceReplay([dip, after], "round_robin", "zero", 0, "memory")
    plan = plan_one(clock, [0, 1])
    assert plan.failure == ("memory_dip", None)  # client 1's dip comes after its training window
    np.testing.assert_array_equal(plan.memory_budget, [ok, ok])


def test_round_duration_is_the_slowest_client_and_the_clock_only_moves_forward() -> None:
    system = SystemConfig(
        bandwidth_down=ResourceConfig(source="uniform", low=0.5, high=5.0),
        compute=ResourceConfig(source="uniform", low=0.5, high=5.0),
    )
    clock, _, _ = clock_for(system)
    times = [clock.now]
    for r in range(5):
        plan = plan_one(clock, [0, 1, 2, 3], r)
        expected = float((plan.download_s + plan.compute_s + plan.upload_s).max())
        assert clock.advance(plan, server_s=123.0) == pytest.approx(expected)  # server time off by default
        times.append(clock.now)
    assert all(b > a for a, b in itertools.pairwise(times))


def test_deadline_and_an_empty_round() -> None:
    clock, _, _ = clock_for(SystemConfig(bandwidth_down=ResourceConfig(source="constant", low=1.0)))
    slowest = float(plan_one(clock, [0]).finish_s[0])
    clock, _, _ = clock_for(
        SystemConfig(bandwidth_down=ResourceConfig(source="constant", low=1.0), deadline_s=slowest / 2)
    )
    plan = plan_one(clock, [0, 1])
    assert plan.failure == ("deadline", "deadline")
    assert clock.advance(plan, 0.0) == clock.cfg.comm_limit_s  # nobody ran: the server waits out the limit


def _slow(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    original = FedAvg.local_train
    calls: list[int] = []

    def slowed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        time.sleep(0.05)  # the simulation host is artificially slow
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FedAvg, "local_train", slowed)
    return calls


def test_simulated_time_does_not_depend_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    _, need, _ = clock_for(SystemConfig())
    system = SystemConfig(  # some clients fail on memory, bandwidth and compute differ per client and round
        memory=ResourceConfig(source="uniform", low=0.5 * need / 2**20, high=2.0 * need / 2**20),
        bandwidth_down=ResourceConfig(source="uniform", low=0.01, high=0.1),
        compute=ResourceConfig(source="uniform", low=0.001, high=0.01),
    )
    # the hosts in this process (backend.processes=1): the slowed training's calls are counted here
    cfg = dataclasses.replace(tiny_config(kind="local", processes=1), system=system, rounds=4)
    fast = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    calls = _slow(monkeypatch)
    slow = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    assert len(calls) == sum(r.clients_run for r in slow.records) > 0  # the slowed training really ran
    assert [r.sim_time_s for r in fast.records] == [r.sim_time_s for r in slow.records]
    assert [r.failed_memory for r in fast.records] == [r.failed_memory for r in slow.records]
    assert sum(r.failed_memory for r in fast.records) > 0
    np.testing.assert_array_equal(
        np.concatenate([p.numpy().ravel() for p in fast.state.params.values()]),
        np.concatenate([p.numpy().ravel() for p in slow.state.params.values()]),
    )
    sim = [r.sim_time_s for r in fast.records]
    assert all(b > a for a, b in itertools.pairwise(sim)) and sim[0] > 0


def test_memory_utilisation_is_the_models_own_need_over_what_the_overhead_leaves() -> None:
    """Issue 33, by hand: a 100 MiB budget, a 20 MiB runtime overhead and a model needing 40 MiB of its own (60 MiB
    with the overhead) use half of the 80 MiB left to them; the overhead's share of the budget (0.2) is apart."""
    mib = 2.0**20
    plan = ClientPlan(
        round_idx=0,
        start_s=0.0,
        client_id=np.array([0, 1, 2]),
        memory_budget=np.array([100.0, 60.0, np.inf]) * mib,
        memory_need=np.array([60.0, 60.0, 60.0]) * mib,
        bandwidth_budget=np.full(3, np.inf),
        bytes_down=np.zeros(3),
        bytes_up=np.zeros(3),
        download_s=np.zeros(3),
        compute_s=np.zeros(3),
        upload_s=np.zeros(3),
        failure=(None, None, None),
        memory_overhead=20.0 * mib,
    )
    np.testing.assert_allclose(plan.memory_util, [0.5, 1.0, np.nan])
    np.testing.assert_allclose(plan.memory_overhead_share, [0.2, 20.0 / 60.0, np.nan])


def test_a_plan_cut_into_rows_and_joined_again_keeps_every_field() -> None:
    """``ClientPlan.row`` and ``concat`` (an asynchronous step's rows) derive the columns from the type's fields:
    every field of the joined rows equals the plan's, the memory overhead and the optional columns included."""
    n = 3
    plan = ClientPlan(
        round_idx=4,
        start_s=7.0,
        client_id=np.array([5, 1, 9]),
        memory_budget=np.array([3.0, 4.0, 5.0]),
        memory_need=np.array([2.0, 2.5, 3.0]),
        bandwidth_budget=np.array([10.0, 20.0, 30.0]),
        bytes_down=np.array([1.0, 2.0, 3.0]),
        bytes_up=np.array([4.0, 5.0, 6.0]),
        download_s=np.array([0.1, 0.2, 0.3]),
        compute_s=np.array([1.0, 2.0, 3.0]),
        upload_s=np.array([0.4, 0.5, 0.6]),
        failure=(None, "memory", None),
        over_budget=("", "", "bandwidth"),
        train_flops=np.array([6.0, 7.0, 8.0]),
        memory_overhead=1.5,
    )
    rows = [plan.row(i) for i in range(n)]
    assert all(len(r.client_id) == 1 and r.memory_overhead == 1.5 for r in rows)
    joined = ClientPlan.concat(rows, plan.round_idx, plan.start_s)
    for f in dataclasses.fields(ClientPlan):
        a, b = getattr(joined, f.name), getattr(plan, f.name)
        if isinstance(b, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=f.name)
        else:
            assert a == b, f.name
    assert ClientPlan.concat([rows[0], dataclasses.replace(rows[1], over_budget=())], 0, 0.0).over_budget == ()
    empty = ClientPlan.empty(2, 0.0)
    assert len(empty.client_id) == 0 and empty.failure == () and empty.duration_s(5.0) == 0.0


def test_the_clock_reports_utilisation_without_the_overhead() -> None:
    """Through the clock: the tiny CNN's own need over (budget - system.memory_overhead_mib)."""
    _, need, _ = clock_for(SystemConfig())  # the model's own need (no overhead)
    mib = 2.0**20
    budget_mib = 4.0 * need / mib + 10.0
    clock, with_overhead, _ = clock_for(
        SystemConfig(memory=ResourceConfig(source="constant", low=budget_mib), memory_overhead_mib=10.0)
    )
    assert with_overhead == pytest.approx(need + 10.0 * mib)
    plan = plan_one(clock, [0, 1])
    np.testing.assert_allclose(plan.memory_util, 0.25)
    np.testing.assert_allclose(plan.memory_overhead_share, 10.0 / budget_mib)


def test_server_time_is_part_of_a_rounds_simulated_duration() -> None:
    """``server_time: measured`` adds the server's measured seconds (search, aggregation, distillation) to the
    planned round; ``none`` leaves them out."""
    system = SystemConfig(bandwidth_down=ResourceConfig(source="constant", low=1.0), server_time="measured")
    clock, _, _ = clock_for(system)
    plan = plan_one(clock, [0, 1])
    planned = plan.duration_s(clock.cfg.comm_limit_s)
    before = clock.now
    assert clock.advance(plan, server_s=7.5) == pytest.approx(planned + 7.5)
    assert clock.now == pytest.approx(before + planned + 7.5)
    off, _, _ = clock_for(dataclasses.replace(system, server_time="none"))
    assert off.advance(plan_one(off, [0, 1]), server_s=7.5) == pytest.approx(planned)
