"""NSGA-II steps on toy objectives with hand-computed fronts."""

from __future__ import annotations

import numpy as np

from rayfl.fl.methods.fedoras.nsga2 import (
    crossover,
    crowding_distance,
    mutate,
    non_dominated_ranks,
    select_survivors,
    tournament,
)


def test_ranks_of_a_hand_made_set() -> None:
    # minimise both: (1,4) (2,2) (4,1) are the front; (3,3) is dominated by (2,2); (4,4) by (3,3)
    f = np.array([[1, 4], [2, 2], [4, 1], [3, 3], [4, 4]], dtype=float)
    assert non_dominated_ranks(f).tolist() == [0, 0, 0, 1, 2]
    crowd = crowding_distance(f, non_dominated_ranks(f))
    # middle of the front: (4 - 1) / 3 + (4 - 1) / 3 = 2; boundaries infinite
    assert crowd[1] == 2.0 and np.isinf(crowd[0]) and np.isinf(crowd[2])


def test_survivor_selection_keeps_the_pareto_front() -> None:
    """Toy objective f(x) = (x, (x - 2)^2) over x in 0..9: the Pareto front is x in {0, 1, 2}; every survivor set of
    at least 3 keeps all of it."""
    x = np.arange(10, dtype=float)
    f = np.stack([x, (x - 2) ** 2], axis=1)
    rng = np.random.default_rng(0)
    for _ in range(20):
        perm = rng.permutation(10)
        kept = perm[select_survivors(f[perm], 4)]
        assert {0, 1, 2} <= set(kept.tolist())
    assert sorted(select_survivors(f, 3).tolist()) == [0, 1, 2]


def test_tournament_prefers_lower_rank() -> None:
    ranks = np.array([0, 1])
    crowd = np.array([0.0, 5.0])
    winners = tournament(ranks, crowd, 200, np.random.default_rng(1))
    # a pair with both indices 1 is the only way to pick 1: a quarter of the draws
    assert 30 < int((winners == 1).sum()) < 70 and set(winners.tolist()) == {0, 1}


def test_crossover_and_mutation_keep_genes_valid() -> None:
    rng = np.random.default_rng(2)
    a, b = np.zeros(8, dtype=np.int64), np.ones(8, dtype=np.int64)
    c, d = crossover(a, b, rng)
    assert np.array_equal(c + d, np.ones(8))  # each gene comes from one parent, the other child gets the other
    assert np.array_equal(mutate(a, 5, 0.0, rng), a)
    m = mutate(a, 5, 1.0, rng)
    assert m.min() >= 0 and m.max() < 5
