"""System-heterogeneous FL through dynamic model search with federated in-place distillation (paper 000).

Per round (Algorithm 2):

* **Assignment.** ``ModelSearch`` (``fl/common/search.py``) picks for every sampled client the structure with the
  largest criterion (parameters by default) that fits its memory and bandwidth budgets, from a sampling pool grown by
  the constrained random search (``explore_probability`` / ``t_max``; the config's docstring gives the paper's two
  readings of epsilon) over per-layer ratios ``S`` (0 removes a skippable block; ``granularity: layer`` ties a
  transformer block's heads and MLP into one layer, as the paper counts them); the pool starts from the smallest
  structure (``smallest``: Table 2's smallest client model, else every dimension at its smallest ratio) and the
  largest.
  The client gets the first-k sub-model of that structure (parameters "from the corresponding position").
* **State.** The pool grows every round and later rounds read it, so it lives in ``ServerState.algo_state`` (a
  ``SearchPool``: structures and assigned structures; ``assign_with_state`` returns it), and checkpoints carry it; the
  ``ModelSearch`` object on the driver is a cache of it (costs, lookup order), rebuilt when a state holds another pool.
* **Aggregation.** The count-normalised element-wise mean, every client weighing 1 (``SubModelAlgorithm``): uncovered
  elements keep their value.
* **In-place distillation** (``distill``, on by default) after aggregation (``fl/common/distill/server.py``); its
  sub-nets are drawn from the same space ``S`` unless ``distill.ratios`` says otherwise.

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

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rayfl.config.sections import TrainConfig
from rayfl.core.errors import ConfigError
from rayfl.core.messages import Assignment, ClientView, ServerState
from rayfl.fl.api.algorithm import RoundStats, ServerContext
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.model_search.config import ModelSearchConfig
from rayfl.models.elastic.spec import first_k

if TYPE_CHECKING:  # search imports rayfl.models.elastic, whose package imports rayfl.algorithms
    from rayfl.fl.common.search import ModelSearch, SearchPool, SearchResult
    from rayfl.models.elastic.family import ElasticFamily

__all__ = ["ModelSearchAlgorithm"]

log = logging.getLogger(__name__)


class ModelSearchAlgorithm(SubModelAlgorithm):
    """Resource-constrained model search, first-k sub-models, count-normalised mean, in-place distillation."""

    name = "model_search"
    config: ModelSearchConfig

    def __init__(self, config: ModelSearchConfig, train: TrainConfig) -> None:
        super().__init__(config, train, distill=config.distill, distill_space=config.ratios)
        self._search: ModelSearch | None = None  # a cache of ``ServerState.algo_state`` (a ``SearchPool``)
        self._pool: SearchPool | None = None  # the pool ``_search`` holds, as last put into a state
        self._last: SearchResult | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_search"] = None  # driver-only: the pool and its cost model stay on the driver
        state["_pool"] = None
        state["_last"] = None
        return state

    def family_problems(self, family: ElasticFamily) -> list[tuple[tuple[str, ...], str]]:
        """A named smallest model (``smallest.blocks``) that ``family`` cannot hold."""
        from rayfl.fl.common.search import named_structure

        if self.config.smallest is None:
            return []
        try:
            named_structure(family, self.config.smallest.ratio, self.config.smallest.blocks)
        except ValueError as err:
            return [(("smallest", "blocks"), str(err))]
        return []

    def bind_server(self, ctx: ServerContext) -> None:
        from rayfl.fl.common.search import ModelSearch, named_structure

        super().bind_server(ctx)
        family = self.require_family()
        cfg = self.config
        for key, reason in self.family_problems(family):  # one located line before round 0, not a traceback
            raise ConfigError(reason, ".".join(("algorithm", *key)))
        smallest = None if cfg.smallest is None else named_structure(family, cfg.smallest.ratio, cfg.smallest.blocks)
        self._search = ModelSearch(
            family.space,
            self.cost,
            cfg.ratios,
            epsilon=cfg.stop_threshold,
            t_max=cfg.t_max,
            criterion=cfg.criterion,
            admit=cfg.admit,
            groups=family.layer_groups() if cfg.granularity == "layer" else None,
            smallest=smallest,
            seed=ctx.seed,
        )
        self._pool = None
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

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        return self.assign_with_state(state, round_idx, views)[0]

    def assign_with_state(
        self, state: ServerState, round_idx: int, views: Sequence[ClientView]
    ) -> tuple[dict[int, Assignment], ServerState]:
        """``capabilities.StatefulAssign``: the round's search; the grown pool goes into ``state.algo_state`` (a
        ``SearchPool``)."""
        search = self._search_of(state)
        result = search.assign_round(views, round_idx)
        self._last = result
        self._server_train_s = math.nan  # set again by server_update when distillation runs this round
        self._pool = search.pool_state()
        assignments = {c.client_id: self.assignment_for(first_k(c.units)) for c in result.choices}
        return assignments, dataclasses.replace(state, algo_state=self._pool)

    def _search_of(self, state: ServerState) -> ModelSearch:
        """The live search, first made to hold ``state``'s pool when it holds another one (a resumed run's, or a
        state the engine rolled back). A state without a pool (a run's first round) uses the search as it is."""
        from rayfl.fl.common.search import SearchPool

        search = self.search
        pool = state.algo_state
        if isinstance(pool, SearchPool) and pool is not self._pool:
            search.load_pool(pool)
            self._pool = pool
        return search

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
