"""FedorAS, phase 2: per-tier search over the trained supernet's paths, on the server (a server phase).

Paper 003 Sec. 3.4 and the official ``src/search.py`` / ``src/nsga2.py`` (ALGORITHMS.md section 10). The phase takes
over supernet training's state (parameters and ``FedorASState``: tiers and FLOPs brackets) and runs no client:

* **Fitness** of a path: top-1 accuracy of the path realised with the supernet's weights on ``val_examples`` examples
  drawn once, seeded, from the data set's held-out validation set (``data.val_fraction`` of every client's samples,
  which no client trains on: the paper's global validation set, "a held-out portion of the clients' datasets",
  App. J.1), or with ``validation: train`` from the pooled training data.
  Candidates are evaluated in parallel through the engine's ``TaskPool`` (Ray tasks on the Ray backend), split into
  ``workers`` chunks; each evaluation is deterministic (one torch thread, fixed batches), so the pool does not change
  the result.
* **First round**: per tier ``population`` distinct valid paths, drawn by the budgeted path sampler under the tier's
  upper edge and kept when they reach its lower edge. **Each later round** is one generation per tier: ``parents``
  children, each pair from two parents picked by binary tournament, uniform crossover and per-layer mutation
  (``mutation``); a child that is already scored in this tier or already among the children is dropped and the pair
  drawn again (at most ``10 x parents`` pairs), and any shortfall is filled with uniform random unscored paths, as the
  official ``nsga2.crossover`` does (so every child is a new path, as with pymoo's ``eliminate_duplicates``). Then
  NSGA-II survivor selection over the population and the children, duplicates removed first (a path counts once, or
  copies would crowd the front), on two minimised objectives: minus the score and the path's parameters (the paper's
  accuracy and model size within the tier, Sec. 3.4; the FLOPs bracket keeps the tier's compute). A child outside its
  tier's bracket is not evaluated; its score is minus its distance to the bracket over the largest path's FLOPs (the
  official ``_score_invalid``, which adds the upper edge to the distance below the bracket: a slip we do not copy),
  and its size objective is above every path's, so every in-bracket path dominates it (Deb's constrained domination;
  the official search ranks by the score alone, which orders them the same way). ``method: supernet_random``
  replaces the children by fresh distinct valid random paths, scored with the supernet's weights (random search in
  the supernet; paper 003's App. E baseline instead trains sampled architectures from scratch, which this is not).
* **Budget**: the official search evaluates 1,000 in-bracket paths per tier (128 at first, then generations of 64,
  the last one overshooting). Here a round is one generation, so ``rounds`` bounds the search, and
  ``max_evaluations`` stops a tier's breeding once it has evaluated that many (the paper's budget is
  ``max_evaluations: 1000`` with ``rounds`` of at least 1 + (1000 - 128) / 64, i.e. 15, more when children fall
  outside the bracket); a tier that stopped keeps its population while the others go on.
* **Result**: per tier the best in-bracket path by validation accuracy, kept in ``SearchState``.
* **Simulated time**: the forward FLOPs of every evaluation over ``server_gflops`` (modelled server time).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Assignment, ClientView, Params, ServerState
from rayfl.data.federated import Rows
from rayfl.fl.api.algorithm import Algorithm, RoundStats, ServerContext
from rayfl.fl.methods.fedoras.algorithm import FedorASState, TierPlan, context_tables, supernet_family
from rayfl.fl.methods.fedoras.config import FedorASSearchConfig
from rayfl.fl.methods.fedoras.nsga2 import (
    crossover,
    crowding_distance,
    mutate,
    non_dominated_ranks,
    select_survivors,
    tournament,
)
from rayfl.fl.methods.fedoras.sampling import OpTables, novel_paths_in_bracket, path_flops, path_key, random_paths
from rayfl.models.inputs import InputSpec, to_input

if TYPE_CHECKING:  # the elastic package imports rayfl.algorithms; the engine imports the algorithms
    from rayfl.fl.api.tasks import TaskPool
    from rayfl.models.supernet import SupernetFamily
from rayfl.core.rng import derive_rng

__all__ = ["FedorASSearch", "SearchState", "TierSearch", "evaluate_paths"]


@dataclass(frozen=True)
class TierSearch:
    """One tier's search: current population (distinct paths, scores), everything scored so far (out-of-bracket
    children included, by their negative distance), the best path; ``evaluations``: in-bracket paths evaluated."""

    paths: np.ndarray  # (n, L)
    scores: np.ndarray  # (n,)
    seen_paths: np.ndarray  # (m, L)
    seen_scores: np.ndarray  # (m,)
    evaluations: int

    @property
    def best(self) -> tuple[np.ndarray, float]:
        k = int(np.argmax(self.seen_scores))
        return self.seen_paths[k], float(self.seen_scores[k])


@dataclass(frozen=True)
class SearchState:
    """The search phase's state: the tiers it inherited and each tier's search."""

    tiers: TierPlan
    searches: tuple[TierSearch, ...] = ()

    def best_paths(self) -> list[np.ndarray]:
        return [s.best[0] for s in self.searches]


def evaluate_paths(
    family: SupernetFamily,
    params: dict[str, np.ndarray],
    x: Rows,
    y: np.ndarray,
    spec: InputSpec,
    batch_size: int,
    paths: np.ndarray,
) -> np.ndarray:
    """Validation accuracy of each path realised with the supernet's ``params`` (one torch thread, fixed batches)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        labels = torch.from_numpy(np.array(y, dtype=np.int64))  # a copy: object-store arrays are read-only
        out = np.zeros(len(paths))
        for i, path in enumerate(paths):
            with torch.device("meta"):
                model = family.build(family.units_of_path(path))
            model = model.to_empty(device="cpu")
            with torch.no_grad():
                for name, tensor in model.state_dict().items():
                    tensor.copy_(torch.from_numpy(np.asarray(params[name])))
            model.eval()
            correct = 0
            with torch.no_grad():
                for lo in range(0, len(labels), batch_size):
                    logits = model(to_input(x[lo : lo + batch_size], spec, torch.device("cpu")))
                    correct += int((logits.argmax(dim=1) == labels[lo : lo + batch_size]).sum())
            out[i] = correct / max(1, len(labels))
        return out
    finally:
        torch.set_num_threads(threads)


class FedorASSearch(Algorithm):
    """Server phase: NSGA-II (or random) search per tier (module docstring)."""

    name = "fedoras_search"
    config: FedorASSearchConfig

    def __init__(self, config: FedorASSearchConfig, train: TrainConfig) -> None:
        super().__init__(config, train)
        self._tables: OpTables | None = None
        self._val: tuple[np.ndarray, np.ndarray] | None = None  # driver only
        self._search_s = float("nan")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_val"] = None
        return state

    def bind_server(self, ctx: ServerContext) -> None:
        super().bind_server(ctx)
        self._tables = context_tables(ctx, "fedoras_search")
        ds = ctx.dataset
        y: Rows  # the training labels may be made on demand (``data.synthetic_labels: image``)
        if self.config.validation == "held_out":
            if ds.x_val is None or ds.y_val is None:
                raise ValueError(
                    "fedoras_search: validation: held_out needs a validation set: set data.val_fraction above 0"
                )
            if not len(ds.y_val):
                raise ValueError(
                    "fedoras_search: validation: held_out found an empty validation set: data.val_fraction holds out "
                    "nothing from clients of fewer than two samples"
                )
            x, y = ds.x_val, ds.y_val
        else:
            x, y = ds.x, ds.y
        count = min(self.config.val_examples, len(y))
        index = np.sort(derive_rng(ctx.seed, "fedoras-val").choice(len(y), size=count, replace=False))
        self._val = (np.asarray(x[index]), np.asarray(y[index]))

    @property
    def tables(self) -> OpTables:
        if self._tables is None:
            raise RuntimeError("fedoras_search: bind_server must run first")
        return self._tables

    # ------------------------------------------------------------------------------------------ phase hooks
    def init_state(self, params: Params) -> ServerState:
        raise ValueError("fedoras_search continues a fedoras phase; it cannot be a run's first phase")

    def enter_phase(self, previous: ServerState, round_idx: int) -> ServerState:
        inherited = previous.algo_state
        if not isinstance(inherited, FedorASState | SearchState):
            raise ValueError("fedoras_search must follow a fedoras (supernet training) phase")
        return ServerState(params=previous.params, round_idx=round_idx, algo_state=SearchState(inherited.tiers))

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        return {}

    def server_round(self, state: ServerState, round_idx: int, pool: TaskPool) -> tuple[ServerState, float]:
        """The initial populations (first round) or one generation per tier; returns modelled server seconds."""
        began = time.perf_counter()
        search = state.algo_state
        if not isinstance(search, SearchState):
            raise ValueError("fedoras_search: the state holds no search")
        seed = self.server.seed
        candidates: list[np.ndarray] = []
        for tier in range(search.tiers.num_tiers):
            rng = derive_rng(seed, "fedoras-search", round_idx, tier)
            lo, hi = search.tiers.edges[tier], search.tiers.edges[tier + 1]
            if not search.searches:
                population = self.valid_paths(self.config.population, lo, hi, rng, set())
                if not len(population):
                    raise ValueError(f"fedoras_search: no path lies in tier {tier}'s bracket [{lo:.0f}, {hi:.0f}]")
                candidates.append(population)
            else:
                candidates.append(self.children(search.searches[tier], lo, hi, rng))
        scores, evaluated_flops = self.score(state.params, search, candidates, pool)
        searches = []
        for tier, (paths, score) in enumerate(zip(candidates, scores, strict=True)):
            searches.append(self.survive(search, tier, paths, score))
        self._search_s = time.perf_counter() - began
        model_s = evaluated_flops * len(self._validation()[1]) / (self.config.server_gflops * 1e9)
        return replace(state, algo_state=replace(search, searches=tuple(searches))), model_s

    # ------------------------------------------------------------------------------------------ search steps
    def valid_paths(self, count: int, lo: float, hi: float, rng: np.random.Generator, seen: set[bytes]) -> np.ndarray:
        """Up to ``count`` distinct paths with FLOPs in ``[lo, hi]`` not in ``seen``, from the budgeted sampler."""
        return novel_paths_in_bracket(self.tables, count, lo, hi, rng, seen)

    def children(self, tier: TierSearch, lo: float, hi: float, rng: np.random.Generator) -> np.ndarray:
        """One generation's ``parents`` new paths (module docstring): none of them scored before, no two alike."""
        count, tables = self.config.parents, self.tables
        if 0 < self.config.max_evaluations <= tier.evaluations:  # the tier's budget is spent
            return np.zeros((0, tables.num_layers), dtype=np.int64)
        seen = {path_key(p) for p in tier.seen_paths}
        if self.config.method == "supernet_random":
            return self.valid_paths(count, lo, hi, rng, seen)
        ranks, crowd = self.ranking(tier.paths, tier.scores, lo, hi)
        kids: list[np.ndarray] = []
        for _ in range(10 * count):
            if len(kids) >= count:
                break
            a, b = tier.paths[tournament(ranks, crowd, 2, rng)]
            for kid in crossover(a, b, rng):
                kid = mutate(kid, tables.num_ops, self.config.mutation, rng)
                if len(kids) < count and path_key(kid) not in seen:
                    seen.add(path_key(kid))
                    kids.append(kid)
        for _ in range(100 * (count - len(kids))):  # the official fill: uniform random paths not seen yet
            if len(kids) >= count:
                break
            kid = random_paths(tables, 1, rng)[0]
            if path_key(kid) not in seen:
                seen.add(path_key(kid))
                kids.append(kid)
        return np.stack(kids) if kids else np.zeros((0, tables.num_layers), dtype=np.int64)

    def ranking(self, paths: np.ndarray, scores: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        """Non-dominated rank and crowding distance of every path on ``objectives``."""
        f = self.objectives(paths, scores, lo, hi)
        ranks = non_dominated_ranks(f)
        return ranks, crowding_distance(f, ranks)

    def objectives(self, paths: np.ndarray, scores: np.ndarray, lo: float, hi: float) -> np.ndarray:
        """Minimised: minus the score, and the path's parameters (model size); a path outside ``[lo, hi]`` counts as
        one parameter larger than the largest path, so every path inside dominates it (constrained domination)."""
        tables = self.tables
        params = tables.fixed_params + tables.params[np.arange(tables.num_layers), paths].sum(axis=1)
        flops = path_flops(tables, paths)
        largest = tables.fixed_params + tables.params.max(axis=1).sum()
        params = np.where((flops >= lo) & (flops <= hi), params, largest + 1.0)
        return np.stack([-np.asarray(scores, dtype=np.float64), params], axis=1)

    def score(
        self, params: Params, search: SearchState, candidates: list[np.ndarray], pool: TaskPool
    ) -> tuple[list[np.ndarray], float]:
        """Scores of every tier's candidates: cached, out-of-bracket distance, or evaluated through the pool."""
        tables, edges = self.tables, search.tiers.edges
        scores = [np.full(len(c), np.nan) for c in candidates]
        todo: list[tuple[int, int]] = []
        queued: dict[bytes, int] = {}
        unique: list[np.ndarray] = []
        for tier, paths in enumerate(candidates):
            seen = {} if not search.searches else _lookup(search.searches[tier])
            flops = path_flops(tables, paths)
            lo, hi = edges[tier], edges[tier + 1]
            for k, path in enumerate(paths):
                key = path_key(path)
                if key in seen:
                    scores[tier][k] = seen[key]
                elif not lo <= flops[k] <= hi:
                    scores[tier][k] = -max(lo - flops[k], flops[k] - hi) / tables.max_flops
                else:
                    if key not in queued:
                        queued[key] = len(unique)
                        unique.append(path)
                    todo.append((tier, k))
        accuracy = self._evaluate(params, np.stack(unique), pool) if unique else np.zeros(0)
        for tier, k in todo:
            scores[tier][k] = accuracy[queued[path_key(candidates[tier][k])]]
        evaluated_flops = float(path_flops(tables, np.stack(unique)).sum()) if unique else 0.0
        return scores, evaluated_flops

    def _validation(self) -> tuple[np.ndarray, np.ndarray]:
        if self._val is None:
            raise RuntimeError("fedoras_search: the validation set lives on the driver")
        return self._val

    def _evaluate(self, params: Params, paths: np.ndarray, pool: TaskPool) -> np.ndarray:
        x, y = self._validation()
        family = supernet_family(self.family)
        spec = self.server.input_spec
        arrays = {k: v.detach().cpu().numpy() for k, v in params.items()}
        chunks = [c for c in np.array_split(paths, min(self.config.workers, len(paths))) if len(c)]
        shared = (family, arrays, x, y, spec, self.config.eval_batch_size)
        return np.concatenate(pool.map(evaluate_paths, shared, chunks))

    def survive(self, search: SearchState, tier: int, paths: np.ndarray, scores: np.ndarray) -> TierSearch:
        """The tier's next population (NSGA-II survivor selection over the population and the children, each path
        once), its scored paths and its evaluation count."""
        lo, hi = search.tiers.edges[tier], search.tiers.edges[tier + 1]
        seen = {} if not search.searches else _lookup(search.searches[tier])
        fresh: list[int] = []
        for k, path in enumerate(paths):
            if path_key(path) not in seen:
                seen[path_key(path)] = float(scores[k])
                fresh.append(k)
        flops = path_flops(self.tables, paths) if len(paths) else np.zeros(0)
        evaluated = int(((flops[fresh] >= lo) & (flops[fresh] <= hi)).sum())
        if not search.searches:
            first = _distinct(paths)
            return TierSearch(paths[first], scores[first], paths[fresh], scores[fresh], evaluated)
        old = search.searches[tier]
        joined_paths = np.concatenate([old.paths, paths])
        joined_scores = np.concatenate([old.scores, scores])
        distinct = _distinct(joined_paths)  # copies would take survivors' places and crowd the front
        pool_paths, pool_scores = joined_paths[distinct], joined_scores[distinct]
        keep = select_survivors(self.objectives(pool_paths, pool_scores, lo, hi), len(old.paths))
        return TierSearch(
            pool_paths[keep],
            pool_scores[keep],
            np.concatenate([old.seen_paths, paths[fresh]]),
            np.concatenate([old.seen_scores, scores[fresh]]),
            old.evaluations + evaluated,
        )

    # ------------------------------------------------------------------------------------------ engine hooks
    def eval_units(self, state: ServerState) -> tuple[int, ...] | None:
        """The top tier's best path so far (the supernet's largest path before the first search round)."""
        family = supernet_family(self.family)
        search = state.algo_state
        if isinstance(search, SearchState) and search.searches:
            return family.units_of_path(search.searches[-1].best[0])
        return family.units_of_path(np.argmax(self.tables.flops, axis=1))

    def phase_result(self, state: ServerState) -> dict[str, object]:
        """Per tier: its FLOPs bracket and clients, the chosen path (op names), its FLOPs, parameters, validation
        accuracy and test accuracy with the supernet's weights, and the paths evaluated."""
        search = state.algo_state
        if not isinstance(search, SearchState) or not search.searches:
            return {}
        family, tables, ds = supernet_family(self.family), self.tables, self.server.dataset
        arrays = {k: v.detach().cpu().numpy() for k, v in state.params.items()}
        best = np.stack(search.best_paths())
        test = evaluate_paths(
            family, arrays, ds.x_test, ds.y_test, self.server.input_spec, self.config.eval_batch_size, best
        )
        tiers: list[dict[str, object]] = []
        for tier, (tier_search, path) in enumerate(zip(search.searches, best, strict=True)):
            tiers.append(
                {
                    "tier": tier,
                    "flops_bracket": [float(search.tiers.edges[tier]), float(search.tiers.edges[tier + 1])],
                    "clients": int((search.tiers.client_tier == tier).sum()),
                    "path": [family.op_names[int(o)] for o in path],
                    "flops": float(path_flops(tables, path)[0]),
                    "params": float(tables.fixed_params + tables.params[np.arange(len(path)), path].sum()),
                    "val_acc": tier_search.best[1],
                    "test_acc": float(test[tier]),
                    "evaluations": tier_search.evaluations,
                }
            )
        return {"method": self.config.method, "tiers": tiers}

    def round_stats(self) -> RoundStats:
        return RoundStats(search_s=self._search_s)

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples)


def _lookup(search: TierSearch) -> dict[bytes, float]:
    return {path_key(p): float(s) for p, s in zip(search.seen_paths, search.seen_scores, strict=True)}


def _distinct(paths: np.ndarray) -> np.ndarray:
    """Indices of the first occurrence of every distinct path, in order."""
    firsts: dict[bytes, int] = {}
    for k, path in enumerate(paths):
        firsts.setdefault(path_key(path), k)
    return np.array(sorted(firsts.values()), dtype=np.int64)
