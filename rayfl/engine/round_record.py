"""A round's rows: the one place where a ``RoundRecord`` and its ``ClientRecord`` rows are built.

Every round policy (training runs' and search-only runs') ends its round through ``policies/round_end.py``, which
builds the rows here, so every kind of run directory holds the same columns computed the same way. What differs is
said by the caller, not guessed here: the client columns come from what the clients did (``trained``: their
outcomes) or, where nothing trains, from the plan (``planned``); a round without evaluation leaves the accuracy
columns NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfl.core.messages import Assignment, ClientOutcome, ServerState
from rayfl.engine.exec.backend import EvalResult
from rayfl.engine.multieval import model_fields
from rayfl.engine.persist.records import ClientAccRecord, ClientRecord, EvalRecord, RoundRecord
from rayfl.fl.api.algorithm import RoundStats
from rayfl.system.clock import ClientPlan

__all__ = [
    "ClientTally",
    "RoundEvaluation",
    "WallTimes",
    "client_records",
    "mean_finite",
    "planned",
    "round_record",
    "system_fields",
    "trained",
]

_MIB, _MB = 2.0**20, 1e6
# failure causes with a column of their own in the round record ("" = the client trained)
_NAMED_CAUSES = ("", "memory", "bandwidth", "memory_dip", "no_network", "unavailable")


@dataclass(frozen=True)
class ClientTally:
    """The round's client columns: how many ran and failed, the bytes they moved, their mean training loss and the
    multiply-accumulates of their local training."""

    clients_run: int
    clients_failed: int
    bytes_down: int
    bytes_up: int
    train_loss: float = math.nan
    train_macs: float = 0.0


def trained(plan: ClientPlan, outcomes: Sequence[ClientOutcome]) -> ClientTally:
    """A training round's tally from its outcomes: clients that failed in the plan or in training count as failed, an
    upload lost on its link does not count as sent bytes, the loss is the example-weighted mean of the clients that
    succeeded."""
    ok = [o for o in outcomes if o.failure is None]
    weights = np.array([o.num_examples for o in ok], dtype=np.float64)
    losses = np.array([o.train_loss for o in ok], dtype=np.float64)
    return ClientTally(
        clients_run=len(outcomes),
        clients_failed=len(plan.client_id) - len(ok),
        bytes_down=sum(o.bytes_down for o in outcomes),
        bytes_up=sum(o.bytes_up for o in outcomes if o.failure in (None, "link_up")),  # lost uploads
        train_loss=float(weights @ losses / weights.sum()) if len(ok) else math.nan,
        train_macs=float(plan.train_flops[plan.runs].sum()) / 2.0 if len(plan.train_flops) else 0.0,
    )


def planned(plan: ClientPlan) -> ClientTally:
    """A round that trains nothing (search-only): the clients whose plan lets them finish count as run, the bytes
    are their planned transfers, no loss and no training work."""
    runs = plan.runs
    return ClientTally(
        clients_run=int(runs.sum()),
        clients_failed=int((~runs).sum()),
        bytes_down=int(plan.bytes_down[runs].sum()),
        bytes_up=int(plan.bytes_up[runs].sum()),
    )


@dataclass(frozen=True)
class RoundEvaluation:
    """An evaluated round: the main evaluation, every global model's, the named structures' rows (``evals.csv``),
    the device-average columns and, with per-client test data, each client's accuracy on its model."""

    main: EvalResult
    models: Sequence[EvalResult]
    structures: list[EvalRecord]
    device_fields: dict[str, float]
    client_accs: list[ClientAccRecord]


@dataclass(frozen=True)
class WallTimes:
    """Host-clock readings (``time.perf_counter``) of one round, for the record's wall columns: the run's start
    (``offset_s``: wall seconds spent on it before this process took it over), the round's start, the end of local
    training and reduction, the start of evaluation and the end of the round's work."""

    run_start: float
    round_start: float
    trained: float
    eval_start: float
    end: float
    offset_s: float = 0.0


def round_record(
    *,
    round_idx: int,
    sim_time_s: float,
    sim_duration_s: float,
    plan: ClientPlan,
    clients: Sequence[ClientRecord],
    tally: ClientTally,
    stats: RoundStats,
    state: ServerState,
    wall: WallTimes,
    outcomes: Sequence[ClientOutcome] = (),
    evaluation: RoundEvaluation | None = None,
    lr: float = math.nan,
    phase: str = "",
    faults: int = 0,
    rolled_back: bool = False,
) -> RoundRecord:
    """The round's ``RoundRecord`` (its checkpoint columns are filled in when one is written)."""
    runs = plan.runs
    main = None if evaluation is None else evaluation.main
    device_fields: dict[str, Any] = {} if evaluation is None else evaluation.device_fields
    return RoundRecord(
        round_idx=round_idx,
        sim_time_s=sim_time_s,
        train_loss=tally.train_loss,
        test_acc=main.accuracy if main is not None else math.nan,
        test_loss=main.loss if main is not None else math.nan,
        clients_run=tally.clients_run,
        clients_failed=tally.clients_failed,
        bytes_down=tally.bytes_down,
        bytes_up=tally.bytes_up,
        wall_time_s=wall.offset_s + wall.end - wall.run_start,
        round_wall_s=wall.end - wall.round_start,
        train_wall_s=wall.trained - wall.round_start,
        eval_wall_s=wall.end - wall.eval_start,
        lr=lr,
        sim_duration_s=sim_duration_s,
        clients_sampled=len(plan.client_id),
        **system_fields(plan.memory_util[runs], plan.bandwidth_util[runs], clients, stats),
        memory_overhead_share=mean_finite(plan.memory_overhead_share[runs]),
        phase=phase,
        **model_fields(
            None if evaluation is None else evaluation.models,
            state,
            outcomes,
            [] if evaluation is None else evaluation.client_accs,
        ),
        **device_fields,
        train_macs=tally.train_macs,
        faults=faults,
        rolled_back=int(rolled_back),
    )


def system_fields(
    memory_util: np.ndarray, bandwidth_util: np.ndarray, clients: Sequence[ClientRecord], stats: RoundStats
) -> dict[str, Any]:
    """A round record's system columns: mean utilisation of the clients that ran, failures by cause, over-budget
    clients and the algorithm's own statistics."""
    causes = [r.failure for r in clients]
    return {
        "memory_util": mean_finite(memory_util),
        "bandwidth_util": mean_finite(bandwidth_util),
        "failed_memory": causes.count("memory"),
        "failed_bandwidth": causes.count("bandwidth"),
        "failed_memory_dip": causes.count("memory_dip"),
        "failed_no_network": causes.count("no_network"),
        "failed_unavailable": causes.count("unavailable"),
        "failed_other": sum(1 for c in causes if c not in _NAMED_CAUSES),
        "over_budget": sum(1 for r in clients if r.over_budget and not r.failure),
        "search_s": stats.search_s,
        "distinct_structures": stats.distinct_structures,
        "hit_rate": stats.hit_rate,
        "server_train_s": stats.server_train_s,
    }


def mean_finite(values: np.ndarray) -> float:
    """The mean of the finite entries (NaN when there are none): utilisation over clients with finite budgets."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else math.nan


def client_records(
    plan: ClientPlan, outcomes: Sequence[ClientOutcome], assignments: Mapping[int, Assignment]
) -> list[ClientRecord]:
    """One row per sampled client: the plan's numbers, and the failure the plan or the training produced."""
    trained_failure = {o.client_id: o.failure for o in outcomes}
    links = {o.client_id: (o.p_down, o.p_up) for o in outcomes}
    over = plan.over_budget or ("",) * len(plan.client_id)
    return [
        ClientRecord(
            round_idx=plan.round_idx,
            client_id=int(c),
            memory_budget_mib=float(plan.memory_budget[i] / _MIB),
            memory_need_mib=float(plan.memory_need[i] / _MIB),
            memory_util=float(plan.memory_util[i]),
            bandwidth_budget_mb=float(plan.bandwidth_budget[i] / _MB),
            bandwidth_need_mb=float(plan.bandwidth_need[i] / _MB),
            bandwidth_util=float(plan.bandwidth_util[i]),
            download_s=float(plan.download_s[i]),
            compute_s=float(plan.compute_s[i]),
            upload_s=float(plan.upload_s[i]),
            failure=plan.failure[i] or trained_failure.get(int(c)) or "",
            over_budget=over[i],
            units=_units_text(assignments[int(c)].units),
            p_down=links.get(int(c), (math.nan, math.nan))[0],
            p_up=links.get(int(c), (math.nan, math.nan))[1],
            model_id=assignments[int(c)].model_id,
            train_macs=float(plan.train_flops[i]) / 2.0 if plan.failure[i] is None and len(plan.train_flops) else 0.0,
            start_version=plan.round_idx,
            start_s=plan.start_s,
        )
        for i, c in enumerate(plan.client_id)
    ]


def _units_text(units: tuple[int, ...] | None) -> str:
    return "" if units is None else " ".join(str(u) for u in units)
