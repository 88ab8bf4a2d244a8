"""System-heterogeneous FL through dynamic model search with federated in-place distillation (paper 000).

Per round (Algorithm 2):

* **Assignment.** ``ModelSearch`` (``algorithms/search.py``) picks for every sampled client the structure with the
  largest criterion (parameters by default) that fits its memory and bandwidth budgets, from a sampling pool grown by
  the epsilon / ``t_max`` constrained random search over per-dimension ratios ``S`` (0 removes a skippable block).
  The client gets the first-k sub-model of that structure (parameters "from the corresponding position").
* **Aggregation.** The count-normalised element-wise mean, every client weighing 1 (``SubModelAlgorithm``): uncovered
  elements keep their value.
* **In-place distillation** (``distill``, on by default) after aggregation (``algorithms/distill.py``); its sub-nets
  are drawn from the same space ``S`` unless ``distill.ratios`` says otherwise.

Choices where the paper is open:

* A structure whose units equal the full model is assigned through the family like any other (units recorded, the
  slices cover everything); training it is bit for bit training the full model, so with unconstrained budgets and
  distillation off a run equals FedAvg with uniform weighting.
* A client that nothing fits gets the smallest structure (``ModelSearch``'s fallback); the clock then fails it for
  the budget it breaks, which is recorded, rather than the method silently exceeding it.
* **ReLU6** (Sec. 3.4): the paper bounds activations because skipped blocks can make them blow up. The activation is
  a model setting (``model.act``), not forced here: when the space can skip blocks (0 in ``ratios`` and a skippable
  dimension) and the model's ``act`` is not ``relu6``, a warning naming ``model.act: relu6`` is logged once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rayfl.algorithms.base import RoundStats, ServerContext
from rayfl.algorithms.payloads import Assignment, ClientView, ServerState
from rayfl.algorithms.submodel import SubModelAlgorithm, first_k
from rayfl.config import ModelSearchConfig, TrainConfig

if TYPE_CHECKING:  # search imports rayfl.models.elastic, whose package imports rayfl.algorithms
    from rayfl.algorithms.search import ModelSearch, SearchResult

__all__ = ["ModelSearchAlgorithm"]

log = logging.getLogger(__name__)


class ModelSearchAlgorithm(SubModelAlgorithm):
    """Resource-constrained model search, first-k sub-models, count-normalised mean, in-place distillation."""

    name = "model_search"
    config: ModelSearchConfig

    def __init__(self, config: ModelSearchConfig, train: TrainConfig) -> None:
        super().__init__(config, train)
        self._search: ModelSearch | None = None
        self._last: SearchResult | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_search"] = None  # driver-only: the pool and its cost model stay on the driver
        state["_last"] = None
        return state

    def bind_server(self, ctx: ServerContext) -> None:
        from rayfl.algorithms.search import ModelSearch

        super().bind_server(ctx)
        family = self.require_family()
        cfg = self.config
        self._search = ModelSearch(
            family.space,
            self.cost,
            cfg.ratios,
            epsilon=cfg.epsilon,
            t_max=cfg.t_max,
            criterion=cfg.criterion,
            admit=cfg.admit,
            seed=ctx.seed,
        )
        self._last = None
        can_skip = min(cfg.ratios) <= 0.0 and bool(family.space.skippable.any())
        act = getattr(getattr(family, "cfg", None), "act", None)
        if can_skip and act is not None and act != "relu6":
            log.warning(
                "model_search: the search space removes blocks (0 in algorithm.ratios) but model.act is %r; the paper "
                "bounds activations with ReLU6 for this (Sec. 3.4): set `model.act: relu6`",
                act,
            )

    @property
    def search(self) -> ModelSearch:
        if self._search is None:
            raise RuntimeError("model_search: assign called before bind_server")
        return self._search

    def distill_ratios(self) -> tuple[float, ...]:
        return tuple(float(r) for r in self.config.ratios)

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        result = self.search.assign_round(views, round_idx)
        self._last = result
        self._server_train_s = math.nan  # set again by server_update when distillation runs this round
        return {c.client_id: self.assignment_for(first_k(c.units)) for c in result.choices}

    def round_stats(self) -> RoundStats:
        last, server_train_s = self._last, self._server_train_s
        self._server_train_s = math.nan  # read once per round (see SubModelAlgorithm.round_stats)
        if last is None:
            return RoundStats(server_train_s=server_train_s)
        return RoundStats(
            search_s=last.search_s,
            distinct_structures=float(last.distinct_assigned),
            hit_rate=last.hit_rate,
            server_train_s=server_train_s,
        )
