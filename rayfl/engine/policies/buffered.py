"""Asynchronous rounds on the simulated clock: FedBuff (Nguyen et al., AISTATS 2022) and FedAsync (Xie et al., 2019).

``concurrency`` (C) clients are in flight. A client starts at a simulated time on the global model version current
then (version = the server steps so far): it checks in there (its budgets read at its own start, so a model can stop
fitting while it waits to be sampled), is assigned by the method with the state of that moment, and its download,
compute and upload times come from its traces exactly as in a sync round (``SimClock.plan`` at its start). Its update
arrives at its finish; one that fails frees its slot when the server stops waiting for it (its start plus
``system.deadline_s``, or ``system.comm_limit_s`` without a deadline). Arrivals are taken in time order, ties by
client id. After every ``buffer_size`` (B) successful arrivals the server steps: one "round" of the records.

The server step. Every applied update is the client's upload ``v`` with the values ``b`` of the version it started
from at the same elements (its delta ``v - b``), turned into a model ``x`` at the current version ``p``:

- ``fedbuff``: ``x = p + s(tau) (v - b)`` (FedBuff's rule: deltas against the start version, staleness-weighted);
- ``fedasync``: ``x = p + mixing s(tau) (v - p)`` (FedAsync's mixing of the client's model into the current one).

The method's own reducer (the count-weighted element-wise mean, ``core/reducers.py``) then averages the ``x`` of the
step's updates, elements no update covers keeping ``p``: so the aggregate minus ``p`` is the weighted mean of the
staleness-weighted deltas, element by element, as sub-model methods aggregate; and the server optimizer
(``server.optimizer``) and the method's ``server_update`` (distillation) take that aggregate as they take a sync
round's. Where ``x`` is the client's own value (no staleness weight, started on the current version), it is used as
it is: B = C = K with ``refill: applied`` and ``staleness: none`` is then the sync round bit for bit.

Training. Which clients start on a version is known once the server steps past it, and their results do not change
when anything happens in simulated time (``compute_time: modelled``), so every client that started on a version is
trained at that step, all of them in one call to the backend (in parallel on Ray); the uploads are held by the server
(``Flight``) until each arrives. Everything here is part of the checkpoint (``AsyncState``).

Sampling: a version's first clients, when nobody is in flight, are the sync sample of that round
(``engine/sampling.py``); every other start draws uniformly among the clients that are neither in flight nor started
on the current version, keyed by the run's start counter.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from rayfl.core.messages import Aggregate, Assignment, ClientOutcome, ClientUpdate, ServerState, TrainTask
from rayfl.core.reducers import Partial
from rayfl.core.rng import derive_rng
from rayfl.engine.exec.client_state import KeptUpload, first_values, pads
from rayfl.engine.parts import RunParts
from rayfl.engine.persist.records import ClientRecord, RoundRecord
from rayfl.engine.persist.resume import RunProgress
from rayfl.engine.policies.round_end import ClientStart, RoundWork, end_round
from rayfl.engine.policies.staleness import staleness_weight
from rayfl.engine.round_record import RoundEvaluation
from rayfl.engine.sampling import sample_clients
from rayfl.engine.steps import plan_clients, train_task, update_server
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api import capabilities
from rayfl.fl.api.algorithm import Algorithm
from rayfl.system.clock import ClientPlan

__all__ = ["SERVER_RULES", "AsyncState", "BufferedRounds", "Flight", "ServerRule", "concurrency", "fedasync", "fedbuff"]


@dataclass
class Flight:
    """One client's trip: started at ``start_s`` on version ``start_version``, its plan there (one row), what it was
    assigned and its task; once trained, its outcome and, if it succeeded, its upload and the start version's values
    at the same elements (``base``, for FedBuff's delta). ``free_s``: when it arrives (or, failed, when the server
    stops waiting)."""

    serial: int
    client_id: int
    start_version: int
    start_s: float
    free_s: float
    plan: ClientPlan
    assignment: Assignment
    task: TrainTask | None  # None: it failed in its plan and never trains
    outcome: ClientOutcome | None = None
    upload: KeptUpload | None = None
    base: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def failure(self) -> str | None:
        planned = self.plan.failure[0]
        return planned if planned is not None else (self.outcome.failure if self.outcome is not None else None)


@dataclass
class AsyncState:
    """An asynchronous run between server steps: every client started and not yet arrived (by start serial), the
    clients started on the current version, and how many starts there were."""

    flights: dict[int, Flight] = field(default_factory=dict)
    started_on_version: list[int] = field(default_factory=list)
    serial: int = 0


def concurrency(cfg: ExperimentConfig) -> int:
    """C: clients in flight."""
    return min(cfg.server.concurrency or cfg.clients_per_round, max(1, cfg.data.num_clients or 1 << 62))


@dataclass(frozen=True)
class ServerRule:
    """What tells FedBuff from FedAsync, resolved once from the config (the module docstring's two rules).

    ``buffer_size``: B, arrivals per server step. ``mixing``: the factor on every update (FedAsync's alpha; FedBuff:
    1). ``from_start``: an update's delta is taken against the version its client started from (FedBuff: those
    values are kept when the client trains) instead of the current version (FedAsync), so only with ``from_start``
    does a client's own value stand for ``x`` just when it started on the current version."""

    buffer_size: int
    mixing: float
    from_start: bool


def fedbuff(cfg: ExperimentConfig) -> ServerRule:
    """FedBuff: B = ``buffer_size`` (0: ceil(C / 2)), deltas against the start version, no mixing."""
    buffer = cfg.server.buffer_size or max(1, math.ceil(concurrency(cfg) / 2))
    return ServerRule(buffer_size=buffer, mixing=1.0, from_start=True)


def fedasync(cfg: ExperimentConfig) -> ServerRule:
    """FedAsync: a step on every arrival, the client's model mixed into the current one by ``mixing``."""
    return ServerRule(buffer_size=1, mixing=cfg.server.mixing, from_start=False)


# ``server.policy`` -> its rule: the one place the asynchronous policies are told apart by name
SERVER_RULES: dict[str, Callable[[ExperimentConfig], ServerRule]] = {"fedbuff": fedbuff, "fedasync": fedasync}


class BufferedRounds:
    """One server step of FedBuff or FedAsync per call (module docstring), by ``rule``."""

    def __init__(self, cfg: ExperimentConfig, rule: ServerRule) -> None:
        self.cfg = cfg
        self.server = cfg.server
        self.rule = rule
        self.concurrency = concurrency(cfg)
        self.buffer = rule.buffer_size
        self.timeout_s = cfg.system.deadline_s if cfg.system.deadline_s > 0 else cfg.system.comm_limit_s
        self._busy_ids: set[int] | None = None  # a cache of ``_busy`` within one step

    # -- the step ------------------------------------------------------------------------------------------------
    def round(
        self, parts: RunParts, run: RunProgress, round_idx: int
    ) -> tuple[RoundRecord, list[ClientRecord], RoundEvaluation | None]:
        cfg, clock, backend, schedule = parts.cfg, parts.clock, parts.backend, parts.schedule
        round_start = time.perf_counter()
        backend.begin_round(round_idx)
        algorithm = schedule.algorithm_at(round_idx)
        if not isinstance(run.policy_state, AsyncState):
            run.policy_state = AsyncState()
        state: AsyncState = run.policy_state
        self._forget_busy()
        if not state.flights and state.serial == 0:  # the run's first clients, all at its start
            self._start(parts, run, round_idx, self.concurrency, clock.now)
        # 1. Arrivals in time order until B updates are buffered (or a sync round's worth of clients failed).
        arrived, step_s = self._arrivals(parts, run, round_idx, state)
        # 2. Training of every client that started on this version (they are all known now), in one call.
        train_start = time.perf_counter()
        self._train(parts, run, round_idx)
        train_done = time.perf_counter()
        # 3. The server step on the buffered updates, staleness-weighted, through the server optimizer and the
        # method's own server update.
        applied = [f for f in arrived if f.failure is None and f.upload is not None]
        weights = staleness_weight(self.server, np.array([round_idx - f.start_version for f in applied]))
        aggregate, shares = self._aggregate(algorithm, run.state, round_idx, applied, weights)
        outcomes = sorted((f.outcome for f in arrived if f.outcome is not None), key=lambda o: o.client_id)
        new_state, rolled_back = update_server(
            algorithm, run.guard, run.state, round_idx, aggregate, outcomes, cfg.server.optimizer
        )
        run.state = new_state
        server_s = (time.perf_counter() - train_done) + (train_start - round_start)
        for flight in arrived:
            del state.flights[flight.serial]
        # 4. The clock moves to the step; the slots the step freed are refilled on the new version.
        previous = clock.now
        # each arrival's time from its own start (a client started at the last step adds exactly its planned
        # duration, as a sync round does), so the clock moves by what a sync round would move it by
        sim_duration_s = max((_since(f, previous) for f in arrived), default=step_s - previous)
        if cfg.system.server_time == "measured":
            sim_duration_s += server_s
        clock.now = previous + sim_duration_s
        state.started_on_version = []
        self._forget_busy()
        if round_idx + 1 < cfg.rounds:
            self._start(parts, run, round_idx + 1, self.concurrency - len(state.flights), clock.now)  # the freed slots
        self._forget_busy()
        # 5. Evaluation when due, and the records (policies/round_end.py, every policy's): the step's arrivals are
        # its clients, in client-id order as a sync round's.
        arrived.sort(key=lambda f: f.client_id)
        work = RoundWork(
            round_idx=round_idx,
            algorithm=algorithm,
            plan=_rows(arrived, round_idx),
            assignments={f.client_id: f.assignment for f in arrived},
            sim_duration_s=sim_duration_s,
            round_start=round_start,
            trained_at=train_done,
            outcomes=outcomes,
            rolled_back=rolled_back,
            applied_staleness=[float(round_idx - f.start_version) for f in applied],
            starts=[ClientStart(f.start_version, f.start_s, shares.get(f.serial, math.nan)) for f in arrived],
            in_flight=len(state.flights),
        )
        return end_round(parts, run, work)

    def _arrivals(
        self, parts: RunParts, run: RunProgress, round_idx: int, state: AsyncState
    ) -> tuple[list[Flight], float]:
        """The step's arrivals in time order (ties by client id) until B updates are buffered or C clients failed,
        each freed slot refilled at its arrival (``refill: arrival``, and always after a failure) unless it fills
        the buffer; returns them and the simulated time of the last."""
        queue = [(f.free_s, f.client_id, f.serial) for f in state.flights.values()]
        heapq.heapify(queue)
        arrived: list[Flight] = []
        buffered = failed = 0
        step_s = parts.clock.now
        while queue and buffered < self.buffer and failed < self.concurrency:
            _, _, serial = heapq.heappop(queue)
            flight = state.flights[serial]
            arrived.append(flight)
            step_s = max(step_s, flight.free_s)
            ok = flight.plan.failure[0] is None
            buffered, failed = buffered + ok, failed + (not ok)
            frees = self.server.refill == "arrival" or not ok  # a failure always frees its slot
            if frees and buffered < self.buffer:  # the arrival that fills the buffer refills after the step
                for new in self._start(parts, run, round_idx, 1, flight.free_s):
                    heapq.heappush(queue, (new.free_s, new.client_id, new.serial))
        return arrived, step_s

    # -- starts --------------------------------------------------------------------------------------------------
    def _busy(self, state: AsyncState) -> set[int]:
        """Clients that cannot start now: in flight (arrived ones too, until their step ends) or started on the
        current version; kept up to date between the step's start and its end (``_forget_busy``)."""
        if self._busy_ids is None:
            self._busy_ids = {f.client_id for f in state.flights.values()} | set(state.started_on_version)
        return self._busy_ids

    def _forget_busy(self) -> None:
        self._busy_ids = None

    def _start(self, parts: RunParts, run: RunProgress, version: int, count: int, at: float) -> list[Flight]:
        """Start ``count`` clients at simulated time ``at`` on ``version``: sampled, checked in there, assigned with
        the method's state now, planned from ``at``."""
        cfg, ds, clock, schedule = parts.cfg, parts.dataset, parts.clock, parts.schedule
        state: AsyncState = run.policy_state  # type: ignore[assignment]
        ids = self._sample(cfg.seed, version, ds.num_clients, count, state, self._busy(state))
        if len(ids) == 0:
            return []
        algorithm = schedule.algorithm_at(version)
        views = clock.check_in(version, ids, [ds.num_examples(int(c)) for c in ids], at=at)
        assignments, run.state = capabilities.assign_with_state(algorithm, run.state, version, views)
        plan = plan_clients(
            clock, algorithm, run.state, version, views, assignments, schedule.train(cfg.train, version), at
        )
        lr = schedule.lr(cfg.train, version)
        started: list[Flight] = []
        for i, c in enumerate(plan.client_id.tolist()):
            row = plan.row(i)
            finish = at + float(row.finish_s[0])
            if row.failure[0] is None and not math.isfinite(finish):
                row = dataclasses.replace(row, failure=("dropped",))
            ok = row.failure[0] is None
            task = train_task(c, version, cfg.seed, lr, assignments[c], run.state, plan.link(i)) if ok else None
            flight = Flight(
                serial=state.serial,
                client_id=c,
                start_version=version,
                start_s=at,
                free_s=finish if ok else at + self.timeout_s,
                plan=row,
                assignment=assignments[c],
                task=task,
            )
            state.flights[state.serial] = flight
            state.serial += 1
            state.started_on_version.append(c)
            if self._busy_ids is not None:
                self._busy_ids.add(c)
            started.append(flight)
        return started

    @staticmethod
    def _sample(seed: int, version: int, num_clients: int, count: int, state: AsyncState, busy: set[int]) -> np.ndarray:
        """``count`` clients to start (module docstring: a version's first, with nobody in flight, are the sync
        sample; others uniform among the clients not ``busy``: in flight or started on this version). Drawn by
        rejection while most clients are free (O(count), not O(N)), from the free list otherwise."""
        if not busy:
            return sample_clients(seed, version, num_clients, count)
        k = min(count, num_clients - len(busy))
        rng = derive_rng(seed, "async-start", state.serial)
        if k <= 0:
            return np.zeros(0, dtype=np.int64)
        if 2 * len(busy) > num_clients:
            free = np.setdiff1d(np.arange(num_clients), np.fromiter(busy, dtype=np.int64, count=len(busy)))
            return np.sort(free[rng.choice(len(free), size=k, replace=False)])
        chosen: list[int] = []
        taken: set[int] = set()
        while len(chosen) < k:
            for c in rng.integers(num_clients, size=2 * (k - len(chosen)) + 4).tolist():
                if c not in busy and c not in taken:
                    taken.add(c)
                    chosen.append(c)
                    if len(chosen) == k:
                        break
        return np.sort(np.asarray(chosen, dtype=np.int64))

    # -- training ------------------------------------------------------------------------------------------------
    def _train(self, parts: RunParts, run: RunProgress, version: int) -> None:
        """Train every client that started on ``version`` and has not trained, in one backend call; keep each
        upload with the version's values at its elements (FedBuff's base)."""
        state: AsyncState = run.policy_state  # type: ignore[assignment]
        due = [f for f in state.flights.values() if f.task is not None and f.outcome is None]
        if not due:
            return
        if any(f.start_version != version for f in due):
            raise RuntimeError("an asynchronous client was left untrained past its start version")
        tasks = [f.task for f in due if f.task is not None]
        params = run.state.params
        run.initial_params = first_values(run.initial_params, params, broadcast=pads(tasks))
        uploads, outcomes = parts.backend.train_each(tasks, params, run.initial_params)
        by_client = {o.client_id: o for o in outcomes}
        for f in due:
            f.outcome = by_client[f.client_id]
            f.upload = uploads.get(f.client_id)
            if f.upload is not None and self.rule.from_start:
                f.base = _values_at(params, f.upload)

    # -- the server's aggregate ----------------------------------------------------------------------------------
    def _aggregate(
        self, algorithm: Algorithm, state: ServerState, version: int, applied: Sequence[Flight], weights: np.ndarray
    ) -> tuple[Aggregate, dict[int, float]]:
        """The reducer's mean of the applied updates rebased on the current version (module docstring), in arrival
        order; returns it with each update's share of the step (its weight x staleness weight over the weights)."""
        if not applied:
            return Aggregate(params={}, coverage={}, num_clients=0), {}
        reducer = algorithm.reducer
        current = state.params
        shapes = {k: v.shape for k, v in current.items()}
        partial: Partial = {}
        for flight, s in zip(applied, weights.tolist(), strict=True):
            upload = flight.upload
            assert upload is not None
            values: dict[str, torch.Tensor] = {}
            for name, v in upload.values.items():
                if name not in current:
                    continue
                scale = self.rule.mixing * s
                own = torch.from_numpy(v)
                if scale == 1.0 and (not self.rule.from_start or flight.start_version == version):
                    values[name] = own  # the client's value itself (x = v): no arithmetic to round
                    continue
                tslice = upload.slices.get(name)
                at = current[name] if tslice is None else current[name][tslice.torch_index(tuple(current[name].shape))]
                p = at.to(torch.float64)
                b = torch.from_numpy(flight.base[name]).to(torch.float64) if self.rule.from_start else p
                values[name] = p + scale * (own.to(torch.float64) - b)
            update = ClientUpdate(
                client_id=flight.client_id,
                weight=upload.weight,
                values=values,
                slices=dict(upload.slices),
                num_examples=0,
                train_loss=math.nan,
                num_steps=0,
                tensor_weights=dict(upload.tensor_weights),
            )
            reducer.accumulate(partial, update, shapes)
        merged = reducer.merge([partial])
        params, coverage = reducer.finalize(merged, current)
        total = sum(f.upload.weight for f in applied if f.upload is not None)
        shares = {
            f.serial: (f.upload.weight * s / total if f.upload is not None and total > 0 else math.nan)
            for f, s in zip(applied, weights.tolist(), strict=True)
        }
        covered = reducer.covered(merged, current)
        return Aggregate(params=params, coverage=coverage, num_clients=len(applied), covered=covered), shares


def _since(flight: Flight, t: float) -> float:
    """Simulated seconds from ``t`` to the flight's arrival (or to when the server stops waiting for it)."""
    if flight.plan.failure[0] is None:
        return (flight.start_s - t) + float(flight.plan.finish_s[0])
    return flight.free_s - t


def _values_at(params: dict[str, torch.Tensor], upload: KeptUpload) -> dict[str, np.ndarray]:
    """The global tensors' values at the elements ``upload`` covers (its start version's, for its delta)."""
    out: dict[str, np.ndarray] = {}
    for name in upload.values:
        if name not in params:
            continue
        tensor = params[name]
        tslice = upload.slices.get(name)
        at = tensor if tslice is None else tensor[tslice.torch_index(tuple(tensor.shape))]
        out[name] = at.detach().cpu().numpy().copy()
    return out


def _rows(flights: Sequence[Flight], round_idx: int) -> ClientPlan:
    """The arrived clients' rows as one plan of the step (in the order given), built from ``ClientPlan``'s own fields
    (``ClientPlan.concat``), so that every column a sync round records (the memory overhead too) is recorded here."""
    if not flights:
        return ClientPlan.empty(round_idx, 0.0)
    return ClientPlan.concat([f.plan for f in flights], round_idx, flights[0].start_s)
