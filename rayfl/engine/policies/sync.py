"""Synchronous rounds: the server samples the round's clients, waits for every one that can finish, aggregates.

``server.policy: sync`` (the default) and ``overcommit`` (FedScale; Bonawitz et al., MLSys 2019: sample
ceil(K (1 + o)) clients and aggregate the first K to finish) are this one round; over-commitment only samples more
and drops the late finishers after the plan (``first_to_finish``), so ``overcommit: 0`` is the sync round itself.
Reading ``SyncRounds.round`` top to bottom explains a round: each step is one call into ``engine/steps.py``, and
the round ends (evaluation, records) as every policy's does, in ``policies/round_end.py``.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from rayfl.engine.exec.client_state import first_values, pads
from rayfl.engine.parts import RunParts
from rayfl.engine.persist.records import ClientRecord, RoundRecord
from rayfl.engine.persist.resume import RunProgress
from rayfl.engine.policies.round_end import RoundWork, end_round
from rayfl.engine.round_record import RoundEvaluation
from rayfl.engine.steps import (
    check_in,
    plan_clients,
    train_clients,
    train_tasks,
    update_server,
)
from rayfl.fl.api import capabilities
from rayfl.system.clock import ClientPlan

__all__ = ["OVERCOMMITTED", "SyncRounds", "first_to_finish", "overcommitted_sample"]

OVERCOMMITTED = "overcommit"  # the failure of a client that would finish after the first K


def overcommitted_sample(per_round: int, overcommit: float) -> int:
    """How many clients an over-committed round samples: ceil(K (1 + o)) (K itself at o = 0)."""
    return per_round if overcommit <= 0 else math.ceil(per_round * (1.0 + overcommit) - 1e-9)


def first_to_finish(plan: ClientPlan, keep: int) -> ClientPlan:
    """``plan`` with only the first ``keep`` clients to finish left running (ties by client id); the later ones fail
    ``overcommit``, so they are not run and the round ends when the ``keep``-th finishes."""
    runs = np.flatnonzero(plan.runs)
    if len(runs) <= keep:
        return plan
    order = runs[np.lexsort((plan.client_id[runs], plan.finish_s[runs]))]
    late = set(order[keep:].tolist())
    failure = tuple(OVERCOMMITTED if i in late else f for i, f in enumerate(plan.failure))
    return dataclasses.replace(plan, failure=failure)


class SyncRounds:
    """One synchronous round per call; ``overcommit`` > 0 over-commits (0: plain sync, the default)."""

    def __init__(self, overcommit: float = 0.0) -> None:
        self.overcommit = overcommit

    def round(
        self, parts: RunParts, run: RunProgress, round_idx: int
    ) -> tuple[RoundRecord, list[ClientRecord], RoundEvaluation | None]:
        """One round, step by step (``engine/steps.py``); ``run`` moves on to the round's state. Returns the round's
        record, its clients' rows and its evaluation (``None`` in a round without one)."""
        cfg, ds, clock, backend, schedule = parts.cfg, parts.dataset, parts.clock, parts.backend, parts.schedule
        round_start = time.perf_counter()
        backend.begin_round(round_idx)
        # 0. The phase's algorithm; hand-over at a phase's start; a server phase's work (search).
        algorithm, state, phase_server_s = schedule.begin_round(round_idx, run.state, parts.pool)
        # 1. Check-in: who is sampled, their data sizes and their budgets at the round's simulated start (K clients,
        # or K (1 + o) when over-committing).
        per_round = schedule.clients_per_round(round_idx, cfg.clients_per_round)
        views = check_in(cfg.seed, ds, clock, round_idx, overcommitted_sample(per_round, self.overcommit))
        # 2. Assignment: which (sub-)model each client trains (and state it grows, e.g. a search pool).
        assignments, state = capabilities.assign_with_state(algorithm, state, round_idx, views)
        server_s = time.perf_counter() - round_start
        # 3. Plan: who fits, who fails, how long each takes; only clients that can finish are run (over-committing:
        # only the first K of them to finish).
        plan = plan_clients(
            clock, algorithm, state, round_idx, views, assignments, schedule.train(cfg.train, round_idx)
        )
        if self.overcommit > 0:
            plan = first_to_finish(plan, per_round)
        lr = schedule.lr(cfg.train, round_idx)  # a phase may train with its own schedule
        tasks = train_tasks(plan, assignments, state, cfg.seed, lr, cfg.eval_all_devices)
        # 4. Local training on the hosts and sharded reduction. Clients that pad what their links lost fall back,
        # where they remember nothing, to each global tensor's value when it was first broadcast.
        run.initial_params = first_values(run.initial_params, state.params, broadcast=pads(tasks))
        aggregate, outcomes = train_clients(backend, tasks, state.params, run.initial_params)
        train_done = time.perf_counter()
        plan = clock.measured_compute(plan, {o.client_id: o.train_wall_s for o in outcomes})
        # 5. Server update (skipped when every client failed): the server optimizer, then the method's own step;
        # rolled back when not finite; the clock moves on.
        state, rolled_back = update_server(
            algorithm, run.guard, state, round_idx, aggregate, outcomes, cfg.server.optimizer
        )
        run.state = state
        server_s += time.perf_counter() - train_done
        sim_duration_s = clock.advance(plan, server_s, phase_server_s)
        # 6 and 7. Evaluation when due, and the records (policies/round_end.py, every policy's).
        work = RoundWork(
            round_idx=round_idx,
            algorithm=algorithm,
            plan=plan,
            assignments=assignments,
            sim_duration_s=sim_duration_s,
            round_start=round_start,
            trained_at=train_done,
            outcomes=outcomes,
            rolled_back=rolled_back,
            applied_staleness=[0.0 for o in outcomes if o.failure is None],  # every update is on the current model
        )
        return end_round(parts, run, work)
