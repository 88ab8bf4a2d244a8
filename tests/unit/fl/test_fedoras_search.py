"""FedorAS's search steps on hand-made cost tables: survivors without duplicates, new children only, out-of-bracket
children scored by their distance to the bracket without being evaluated."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import pytest

from rayfl.config.sections import TrainConfig
from rayfl.engine.build import bind_algorithm, build_clock, build_setup
from rayfl.engine.phases import PhasedAlgorithm
from rayfl.fl.api.tasks import LocalTaskPool
from rayfl.fl.methods.fedoras.algorithm import TierPlan
from rayfl.fl.methods.fedoras.config import FedorASSearchConfig
from rayfl.fl.methods.fedoras.nsga2 import non_dominated_ranks
from rayfl.fl.methods.fedoras.sampling import OpTables, path_flops
from rayfl.fl.methods.fedoras.search import FedorASSearch, SearchState, TierSearch
from tests.helpers import tiny_image_dataset
from tests.helpers_fedoras import fedoras_tiny_config

T = TypeVar("T")


class CountingPool(LocalTaskPool):
    """The in-process pool, counting the items it evaluates."""

    def __init__(self) -> None:
        self.items = 0

    def map(self, fn: Callable[..., T], shared: Sequence[Any], items: Sequence[Any]) -> list[T]:
        self.items += sum(len(item) for item in items)
        return super().map(fn, shared, items)


def _search(tables: OpTables, **config: Any) -> FedorASSearch:
    search = FedorASSearch(FedorASSearchConfig(**config), TrainConfig())
    search._tables = tables  # what bind_server reads off the run's cost model
    return search


def _state(edges: list[float], population: np.ndarray, scores: np.ndarray) -> SearchState:
    tier = TierSearch(population, scores, population, scores, len(population))
    return SearchState(TierPlan(np.zeros(4, dtype=np.int64), np.array(edges, dtype=np.float64)), (tier,))


def test_survivors_count_each_path_once() -> None:
    """Population [0,0] [1,1] [2,2] (parameters 2, 4, 0 and scores 0.5, 0.8, 0.2: all three on the Pareto front of
    (-score, parameters)) plus two copies of [1,1] as children. Without removing the copies, the five-point front's
    crowding kept [1,1] twice and dropped [0,0]; each path counts once, so the population stays the whole front."""
    ops = np.array([[1.0, 2.0, 0.0], [1.0, 2.0, 0.0]])
    tables = OpTables(params=ops, flops=np.zeros((2, 3)), fixed_params=0.0, fixed_flops=0.0, identity=None)
    search = _search(tables)
    population = np.array([[0, 0], [1, 1], [2, 2]])
    state = _state([0.0, 10.0], population, np.array([0.5, 0.8, 0.2]))
    kept = search.survive(state, 0, np.array([[1, 1], [1, 1]]), np.array([0.8, 0.8]))
    assert kept.paths.tolist() == [[0, 0], [1, 1], [2, 2]]
    assert kept.scores.tolist() == [0.5, 0.8, 0.2]
    assert kept.evaluations == 3 and len(kept.seen_paths) == 3  # [1,1] was scored already: nothing new


def test_out_of_bracket_children_score_minus_their_distance_and_are_not_evaluated() -> None:
    """Path FLOPs: 5 fixed + 0/10/20 per layer; tier bracket [15, 25]; the largest path has 45 FLOPs. [2,2] (45) is
    20 above the bracket: -20/45; [0,0] (5) is 10 below it: -10/45; [2,1] (35) is 10 above: -10/45; [1,0] (15, on
    the lower edge) was scored before and keeps its score. None of them reaches the evaluation pool."""
    flops = np.array([[0.0, 10.0, 20.0], [0.0, 10.0, 20.0]])
    tables = OpTables(params=np.ones((2, 3)), flops=flops, fixed_params=0.0, fixed_flops=5.0, identity=None)
    search = _search(tables)
    children = np.array([[2, 2], [0, 0], [2, 1], [1, 0]])
    assert path_flops(tables, children).tolist() == [45.0, 5.0, 35.0, 15.0]
    state = _state([15.0, 25.0], np.array([[1, 0], [0, 1]]), np.array([0.4, 0.3]))
    pool = CountingPool()
    scores, evaluated_flops = search.score({}, state, [children], pool)
    assert scores[0].tolist() == pytest.approx([-20 / 45, -10 / 45, -10 / 45, 0.4], abs=0.0)
    assert pool.items == 0 and evaluated_flops == 0.0
    # out-of-bracket paths never survive in place of in-bracket ones, however small (constrained domination)
    kept = search.survive(state, 0, children, scores[0])
    assert sorted(kept.paths.tolist()) == [[0, 1], [1, 0]]
    assert kept.evaluations == 2  # the out-of-bracket children were scored, not evaluated


def test_out_of_bracket_paths_are_dominated_by_every_in_bracket_path() -> None:
    """Two layers, op 1 costs 2 parameters and 5 FLOPs, op 0 nothing; 1 fixed parameter, so the largest path has 5.
    Bracket [5, 10] FLOPs. In it: [1,1] (10 FLOPs, 5 parameters, score 0.0) and [0,1] (5 FLOPs, 3, score 0.3); out
    of it: [0,0] (0 FLOPs, 1 parameter, score -5/10 = -0.5 by its distance). On the plain objectives (-score,
    parameters) [0,0] would be on the front (the smallest model); constrained, it counts as 5 + 1 = 6 parameters, so
    even the worst in-bracket path [1,1] dominates it, and it is the one that loses its survivor place."""
    params = np.array([[0.0, 2.0], [0.0, 2.0]])
    flops = np.array([[0.0, 5.0], [0.0, 5.0]])
    tables = OpTables(params=params, flops=flops, fixed_params=1.0, fixed_flops=0.0, identity=None)
    search = _search(tables)
    paths = np.array([[1, 1], [0, 1], [0, 0]])
    scores = np.array([0.0, 0.3, -0.5])
    assert path_flops(tables, paths).tolist() == [10.0, 5.0, 0.0]
    state = _state([5.0, 10.0], paths[:2], scores[:2])
    assert search.score({}, state, [paths[2:]], CountingPool())[0][0].tolist() == [-0.5]  # 5 below, largest 10
    assert non_dominated_ranks(np.array([[0.0, 5.0], [-0.3, 3.0], [0.5, 1.0]])).tolist() == [1, 0, 0]  # unconstrained
    objectives = search.objectives(paths, scores, 5.0, 10.0)
    assert objectives.tolist() == [[0.0, 5.0], [-0.3, 3.0], [0.5, 6.0]]
    assert non_dominated_ranks(objectives).tolist() == [1, 0, 2]
    kept = search.survive(state, 0, paths[2:], scores[2:])
    assert sorted(kept.paths.tolist()) == [[0, 1], [1, 1]]


def test_children_are_new_distinct_paths() -> None:
    """A generation never repeats a scored path or itself; when crossover and mutation run out of new paths the
    official fill draws random unscored ones (3 layers x 2 ops: 8 paths, 4 scored, so 4 children at most)."""
    tables = OpTables(params=np.ones((3, 2)), flops=np.zeros((3, 2)), fixed_params=0.0, fixed_flops=0.0, identity=None)
    population = np.array([[0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 0, 1]])
    tier = TierSearch(population, np.array([0.1, 0.2, 0.3, 0.4]), population, np.array([0.1, 0.2, 0.3, 0.4]), 4)
    for parents, expected in ((2, 2), (6, 4)):
        search = _search(tables, parents=parents, mutation=0.0)
        kids = search.children(tier, 0.0, 1.0, np.random.default_rng(0))
        keys = {tuple(k) for k in kids.tolist()}
        assert len(kids) == len(keys) == expected
        assert not keys & {tuple(p) for p in population.tolist()}


def test_search_scores_on_a_validation_set_no_client_trains_on() -> None:
    """With ``data.val_fraction`` the search draws its ``val_examples`` from the held-out rows: none of them is in any
    client's training data (it used to draw them from the pooled training data)."""
    cfg = fedoras_tiny_config(kind="local", num_hosts=1)
    setup = build_setup(cfg, tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    assert isinstance(setup.algorithm, PhasedAlgorithm)
    search = setup.algorithm.phases[1].algorithm
    assert isinstance(search, FedorASSearch)
    x, y = search._validation()
    assert setup.dataset.y_val is not None and len(y) == min(40, len(setup.dataset.y_val))
    train = {row.tobytes() for row in np.asarray(setup.dataset.x)}
    val_rows = {row.tobytes() for row in x}
    assert len(val_rows) == len(x) and not val_rows & train
    assert len(setup.dataset.y) + len(setup.dataset.y_val) == len(tiny_image_dataset().y)


def test_a_tier_stops_breeding_at_max_evaluations() -> None:
    tables = OpTables(params=np.ones((3, 2)), flops=np.zeros((3, 2)), fixed_params=0.0, fixed_flops=0.0, identity=None)
    population = np.array([[0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 0, 1]])
    scores = np.array([0.1, 0.2, 0.3, 0.4])
    for evaluated, budget, expected in ((4, 0, 2), (4, 6, 2), (6, 6, 0), (7, 6, 0)):
        tier = TierSearch(population, scores, population, scores, evaluated)
        search = _search(tables, parents=2, max_evaluations=budget)
        assert len(search.children(tier, 0.0, 1.0, np.random.default_rng(0))) == expected
    # a tier without children keeps its population, scored paths and count
    state = _state([0.0, 1.0], population, scores)
    empty = np.zeros((0, 3), dtype=np.int64)
    score, flops = _search(tables).score({}, state, [empty], CountingPool())
    kept = _search(tables).survive(state, 0, empty, score[0])
    assert kept.paths.tolist() == population.tolist() and kept.evaluations == 4 and flops == 0.0
