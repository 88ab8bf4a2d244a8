"""FLuID: Mitigating Stragglers in Federated Learning using Invariant Dropout.

Wang, Nair, Mahajan, NeurIPS 2023 (arXiv:2307.02623); authors' code ``iwang05/FLuID`` (Flower strategies
``fedDrop*_android.py``). Paper 002 uses it as a baseline on FedTrans's largest model (its App. A.1).

Per round:

1. **Stragglers.** A client whose round the whole model does not fit is a straggler; it trains the largest sub-model
   of ``rates`` that fits (the smallest when none does: the clock then fails it, recorded). Everyone else trains the
   whole model.
2. **Invariant dropout.** A straggler's sub-model keeps ``ceil(rate x size)`` units of every dimension of the elastic
   family (``invariant.units_to_drop``): it drops, in this order, the units dropped last round that are still
   invariant, the other invariant units, and random others (generator ``(seed, "fluid", round, client,
   dimension)``). The units dropped and how many are recorded in the server state for the next round.
3. **Invariant units.** Every client that trained the whole model reports each unit's largest relative weight change
   (``invariant.unit_changes``: ``ClientUpdate.metrics`` ``fluid/<dimension>/<unit>``); after aggregation the server
   marks a unit invariant when its change is at most the threshold for at least ``agreement`` (75 %) of them.
4. **Threshold** (authors' code ``find_min`` and ``aggregate_fit``): unless ``threshold`` fixes it, the smallest
   per-unit change of the first dimension (the maximum over the non-stragglers) in the first round with
   non-stragglers, averaged with the second round's; after ``increment_after`` of the run's rounds it grows by
   ``increment`` every ``increment_every`` rounds, until every dimension has as many invariant units as the
   stragglers drop (the authors stop when the first layer has).
5. **Aggregation.** The element-wise mean weighted by samples over the clients that trained each element (the
   authors' ``aggregate_drop``); with no straggler this is FedAvg.

How rayfl's system model maps onto the paper's: the paper profiles each client's training time and calls the slowest
one a straggler, giving it the sub-model size of a table indexed by how much faster the next-slowest client is
(0.95 ... 0.5); rayfl has budgets per client and round instead (memory, bandwidth, and training FLOPs within the
round's deadline ``system.compute_limit_s``), so a straggler is a client that cannot train the whole model within
them, and its size is the largest of the same table that fits: the table's purpose (the straggler finishes with the
others) with the deadline as the target time. Every such client is a straggler, not only the slowest one (the
authors' experiments have five phones and one straggler). Choices where the paper is vague: the first round (the
authors start dropping at round 3, after two rounds of profiling; here a straggler drops at once, at random until
invariant units are known); a unit is a channel of a free dimension of the family (image channels and classes are
never dropped, as the authors keep input and output layers whole); a unit is invariant for a client when all of its
weights are (``invariant`` module docstring); the invariant set is computed with the threshold calibrated in the same
round (the authors' ``find_stable`` runs before ``find_min`` updates it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rayfl.core.messages import (
    Aggregate,
    Assignment,
    ClientOutcome,
    ClientUpdate,
    ClientView,
    Params,
    ServerState,
)
from rayfl.core.rng import derive_rng
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.fluid.config import FLuIDConfig
from rayfl.fl.methods.fluid.invariant import invariant_units, unit_changes, units_to_drop
from rayfl.models.elastic.spec import Selection

__all__ = ["CHANGE_PREFIX", "FLuID", "FLuIDState"]

CHANGE_PREFIX = "fluid/"  # a client's metric "fluid/<dimension>/<unit>": the unit's largest relative change


@dataclass(frozen=True)
class FLuIDState:
    """What later rounds read: the threshold (NaN until calibrated) and how many rounds calibrated it, the invariant
    units per dimension, the units stragglers dropped in the last round that had stragglers and the most any of them
    dropped per dimension, and whether the threshold stopped growing."""

    threshold: float = math.nan
    calibrations: int = 0
    invariant: tuple[tuple[int, ...], ...] = ()
    dropped: tuple[tuple[int, ...], ...] = ()
    drop_counts: tuple[int, ...] = ()
    settled: bool = False


class FLuID(SubModelAlgorithm):
    """Stragglers train invariant-dropout sub-models (module docstring)."""

    name = "fluid"
    config: FLuIDConfig

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples)  # the authors' aggregate_drop weighs by samples, as FedAvg

    def init_state(self, params: Params) -> ServerState:
        return ServerState(params=params, algo_state=FLuIDState())

    @staticmethod
    def _state(state: ServerState) -> FLuIDState:
        if not isinstance(state.algo_state, FLuIDState):
            raise TypeError("fluid: the server state carries no FLuIDState (was it made by init_state?)")
        return state.algo_state

    # ------------------------------------------------------------------------------------------ assignment
    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        return self.assign_with_state(state, round_idx, views)[0]

    def assign_with_state(
        self, state: ServerState, round_idx: int, views: Sequence[ClientView]
    ) -> tuple[dict[int, Assignment], ServerState]:
        """``capabilities.StatefulAssign``: the assignments, and the state with the units dropped this round."""
        fs, space = self._state(state), self.require_family().space
        rates = (1.0, *(float(r) for r in self.config.rates if float(r) < 1.0))
        chosen = self.largest_fitting_rate(views, rates) if views else {}
        dims = space.dims
        dropped: list[set[int]] = [set() for _ in dims]
        counts = [0] * len(dims)
        out: dict[int, Assignment] = {}
        for view in views:
            rate = chosen[view.client_id]
            if rate >= 1.0:
                out[view.client_id] = Assignment()
                continue
            units = self.uniform_units(rate)
            index = []
            for d, (dim, keep) in enumerate(zip(dims, units, strict=True)):
                rng = derive_rng(self.server.seed, "fluid", round_idx, view.client_id, d)
                invariant = fs.invariant[d] if fs.invariant else ()
                before = fs.dropped[d] if fs.dropped else ()
                drop = units_to_drop(dim.size, dim.size - keep, invariant, before, rng)
                index.append(np.setdiff1d(np.arange(dim.size, dtype=np.int64), drop))
                dropped[d].update(int(u) for u in drop)
                counts[d] = max(counts[d], dim.size - keep)
            out[view.client_id] = self.assignment_for(Selection(units, tuple(index)))
        if any(counts):
            fs = dataclasses.replace(fs, dropped=tuple(tuple(sorted(s)) for s in dropped), drop_counts=tuple(counts))
        return out, dataclasses.replace(state, algo_state=fs)

    # ------------------------------------------------------------------------------------------ client side
    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        """The default local training; a client that trained the whole model also reports every unit's largest
        relative weight change (``CHANGE_PREFIX``)."""
        whole = not ctx.task.assignment.slices
        before = {n: p.detach().clone() for n, p in ctx.model.named_parameters()} if whole else {}
        update = super().local_train(ctx, x, y)
        if not whole:
            return update
        changes = unit_changes(self.require_family().space, before, update.values)
        metrics = dict(update.metrics)
        for d, per_unit in enumerate(changes):
            metrics.update({f"{CHANGE_PREFIX}{d}/{u}": float(v) for u, v in enumerate(per_unit)})
        return dataclasses.replace(update, metrics=metrics)

    # ------------------------------------------------------------------------------------------ server side
    def server_update(self, state: ServerState, round_idx: int, aggregate: Aggregate) -> ServerState:
        new = super().server_update(state, round_idx, aggregate)
        cfg, fs = self.config, self._state(state)
        dims = self.require_family().space.dims
        whole = [o for o in aggregate.outcomes if o.failure is None and f"{CHANGE_PREFIX}0/0" in o.metrics]
        threshold, calibrations, invariant = fs.threshold, fs.calibrations, fs.invariant
        if whole:
            changes = [_changes(whole, d, dim.size) for d, dim in enumerate(dims)]
            if cfg.threshold > 0:
                threshold = cfg.threshold
            elif calibrations < 2:  # the authors' find_min at their rounds 2 and 3
                smallest = float(changes[0].max(axis=0).min())
                threshold = smallest if calibrations == 0 else (threshold + smallest) / 2.0
                calibrations += 1
            invariant = tuple(tuple(int(u) for u in invariant_units(c, threshold, cfg.agreement)) for c in changes)
        settled = fs.settled or (
            bool(fs.drop_counts)
            and bool(invariant)
            and all(len(invariant[d]) >= n for d, n in enumerate(fs.drop_counts))
        )
        done = round_idx + 1
        start = math.ceil(cfg.increment_after * self.server.rounds)
        growing = cfg.threshold <= 0 and calibrations >= 2 and not settled and done > start
        if growing and (done - start) % cfg.increment_every == 0:
            threshold += cfg.increment
        fs = dataclasses.replace(
            fs, threshold=threshold, calibrations=calibrations, invariant=invariant, settled=settled
        )
        return dataclasses.replace(new, algo_state=fs)


def _changes(outcomes: Sequence[ClientOutcome], d: int, size: int) -> np.ndarray:
    """``(clients, units)``: the reported changes of dimension ``d``."""
    return np.array([[o.metrics[f"{CHANGE_PREFIX}{d}/{u}"] for u in range(size)] for o in outcomes], dtype=np.float64)
