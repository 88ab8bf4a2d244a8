"""Search-only rounds (``engine/search_only.py``; paper 000, App. E.1): a round that plans and trains nothing.

The round is a sync round's first half, from the same steps (``engine/steps.py``): check-in (budgets at the simulated
time), the algorithm's ``assign_with_state`` and the clock's plan; the clock then advances by the planned round
(slowest client that fits: its download, modelled compute and upload), and the round ends as every policy's does
(``round_end.end_round``), as a round whose clients were only planned: no evaluation, the plan's transfers, the
clients that can finish counted as run. The algorithm's server update never runs; the state changes only by what
assignment grows (model search's pool).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rayfl.core.messages import Assignment, ClientView, ServerState
from rayfl.engine.parts import RunParts
from rayfl.engine.persist.records import ClientRecord, RoundRecord
from rayfl.engine.persist.resume import RunProgress
from rayfl.engine.policies.round_end import RoundWork, end_round
from rayfl.engine.round_record import RoundEvaluation
from rayfl.engine.steps import check_in, plan_clients
from rayfl.fl.api import capabilities
from rayfl.fl.api.algorithm import Algorithm

__all__ = ["PlannedRounds"]


class PlannedRounds:
    """One search-only round per call: assigned and planned, nothing trained (module docstring)."""

    def round(
        self, parts: RunParts, run: RunProgress, round_idx: int
    ) -> tuple[RoundRecord, list[ClientRecord], RoundEvaluation | None]:
        cfg, clock = parts.cfg, parts.clock
        round_start = time.perf_counter()
        algorithm = parts.schedule.algorithm_at(round_idx)
        # 1. Check-in.
        views = check_in(cfg.seed, parts.dataset, clock, round_idx, cfg.clients_per_round)
        # 2. Assignment, on a model without weights.
        assignments, run.state = _assign(algorithm, run.state, round_idx, views, cfg.algorithm.name)
        assign_s = time.perf_counter() - round_start
        # 3. Plan; the clock moves on by the planned round (steps 4 and 5 train and update: none here).
        plan = plan_clients(clock, algorithm, run.state, round_idx, views, assignments, cfg.train)
        sim_duration_s = clock.advance(plan, assign_s)
        # 6 and 7. No evaluation (nothing trained); the records (policies/round_end.py, every policy's).
        work = RoundWork(
            round_idx=round_idx,
            algorithm=algorithm,
            plan=plan,
            assignments=assignments,
            sim_duration_s=sim_duration_s,
            round_start=round_start,
            trained_at=round_start,
            trains=False,
        )
        return end_round(parts, run, work)


def _assign(
    algorithm: Algorithm, state: ServerState, round_idx: int, views: Sequence[ClientView], name: str
) -> tuple[dict[int, Assignment], ServerState]:
    """The algorithm's assignment; one that reads the weights (which live on the meta device) fails saying so."""
    try:
        return capabilities.assign_with_state(algorithm, state, round_idx, views)
    except (NotImplementedError, RuntimeError, TypeError) as err:  # e.g. a meta tensor read as numbers
        raise ValueError(
            f"search-only: algorithm {name!r} could not assign sub-models without weights (the global "
            f"model lives on the meta device and is never trained): {err}"
        ) from err
