"""The end of every round, in one place: step 6 (the evaluation, when one is due) and step 7 (the round's rows).

Every round policy says what its round did as a ``RoundWork`` and ends it with ``end_round``: sync and over-committed
rounds (``sync.py``), FedBuff and FedAsync server steps (``buffered.py``) and search-only rounds (``planned.py``). So
the kinds of run evaluate, time and record a round alike, and a column added to the records is filled for all of
them at once. What differs between them is data in the ``RoundWork``, not a branch here: whether the clients trained
(their outcomes give the client columns, the model is evaluated when due, the round has a learning rate) or were only
planned (search-only: the plan's transfers, nothing evaluated); the staleness of the updates the round applied (0 in
a sync round); and, in an asynchronous step, where each client started (``ClientStart``) and how many are still in
flight.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rayfl.core.messages import Assignment, ClientOutcome
from rayfl.engine.parts import RunParts
from rayfl.engine.persist.records import ClientRecord, RoundRecord
from rayfl.engine.persist.resume import RunProgress
from rayfl.engine.round_record import RoundEvaluation, WallTimes, client_records, planned, round_record, trained
from rayfl.engine.steps import evaluate_round, evaluation_due
from rayfl.fl.api.algorithm import Algorithm
from rayfl.system.clock import ClientPlan

__all__ = ["ClientStart", "RoundWork", "end_round"]


@dataclass(frozen=True)
class ClientStart:
    """Where a client of an asynchronous step started: the model version (server steps) and the simulated time, and
    its share of the step's aggregate (NaN when its update was not applied)."""

    version: int
    start_s: float
    agg_weight: float


@dataclass(frozen=True, kw_only=True)
class RoundWork:
    """What a round did, as its end reads it. ``plan``: one row per client of the round, in client-id order;
    ``round_start`` and ``trained_at``: host-clock readings (``time.perf_counter``) at the round's start and at the
    end of its local training and reduction."""

    round_idx: int
    algorithm: Algorithm
    plan: ClientPlan
    assignments: Mapping[int, Assignment]
    sim_duration_s: float
    round_start: float
    trained_at: float
    outcomes: Sequence[ClientOutcome] = ()
    # False: the clients were only planned (search-only): no outcome, no evaluation, no learning rate
    trains: bool = True
    rolled_back: bool = False
    applied_staleness: Sequence[float] = ()  # server steps since the start version of every update applied
    starts: Sequence[ClientStart] = ()  # per row of ``plan`` (asynchronous steps); empty: all started at the round's
    in_flight: int = 0  # clients still in flight after an asynchronous step


def end_round(
    parts: RunParts, run: RunProgress, work: RoundWork
) -> tuple[RoundRecord, list[ClientRecord], RoundEvaluation | None]:
    """Steps 6 and 7 of ``work``'s round (``run.state``: the model after it): the evaluation when one is due (its
    main result becomes ``run.last_eval``), then the round's record and its clients' rows. Returns the three."""
    cfg, round_idx, algorithm = parts.cfg, work.round_idx, work.algorithm
    # 6. Evaluation of the global model (of every global model when the run holds several).
    eval_start = time.perf_counter()
    evaluation = None
    if work.trains and evaluation_due(cfg, round_idx):
        evaluation = evaluate_round(cfg, parts.backend, algorithm, run.state, parts.clock, parts.dataset, round_idx)
        run.last_eval = evaluation.main
    now = time.perf_counter()
    # 7. Records: the round's row and its clients' rows (engine/round_record.py).
    clients = client_records(work.plan, work.outcomes, work.assignments)
    if work.starts:
        clients = [_started(row, start, round_idx) for row, start in zip(clients, work.starts, strict=True)]
    schedule = parts.schedule
    record = round_record(
        round_idx=round_idx,
        sim_time_s=parts.clock.now,
        sim_duration_s=work.sim_duration_s,
        plan=work.plan,
        clients=clients,
        tally=trained(work.plan, work.outcomes) if work.trains else planned(work.plan),
        stats=algorithm.round_stats(),
        state=run.state,
        wall=WallTimes(parts.start, work.round_start, work.trained_at, eval_start, now, run.wall_offset_s),
        outcomes=work.outcomes,
        evaluation=evaluation,
        lr=schedule.lr(cfg.train, round_idx) if work.trains else math.nan,
        phase=schedule.phase_at(round_idx).name,
        faults=parts.backend.take_faults(),
        rolled_back=work.rolled_back,
    )
    stale = np.asarray(work.applied_staleness, dtype=np.float64)
    record = dataclasses.replace(
        record,
        staleness_mean=float(stale.mean()) if len(stale) else math.nan,
        staleness_max=float(stale.max()) if len(stale) else math.nan,
        in_flight=work.in_flight,
    )
    return record, clients, evaluation


def _started(row: ClientRecord, start: ClientStart, round_idx: int) -> ClientRecord:
    """An asynchronous step's client row: the version and time it started at, its staleness and its share."""
    return dataclasses.replace(
        row,
        start_version=start.version,
        staleness=float(round_idx - start.version),
        start_s=start.start_s,
        agg_weight=start.agg_weight,
    )
