"""NSGA-II (Deb, Pratap, Agarwal, Meyarivan, IEEE TEC 2002) on integer genomes, as FedorAS's search uses it.

All objectives are minimised. ``non_dominated_ranks`` is the fast non-dominated sort (rank 0 = the Pareto front),
``crowding_distance`` the per-front crowding distance (boundary points infinite), ``select_survivors`` fills the next
population front by front and breaks the last front by crowding distance, ``tournament`` is the binary tournament on
(rank, crowding), and ``crossover``/``mutate`` are uniform crossover and per-gene random-reset mutation (the official
``nsga2.py`` operators on paths: one op index per layer). Ties are broken by index, so every step is a pure function of
its inputs and the generator.
"""

from __future__ import annotations

import numpy as np

__all__ = ["crossover", "crowding_distance", "mutate", "non_dominated_ranks", "select_survivors", "tournament"]


def _dominates(objectives: np.ndarray) -> np.ndarray:
    """``d[i, j]``: ``i`` dominates ``j`` (no worse in every objective, better in one)."""
    f = np.asarray(objectives, dtype=np.float64)
    le = (f[:, None, :] <= f[None, :, :]).all(axis=2)
    lt = (f[:, None, :] < f[None, :, :]).any(axis=2)
    return np.asarray(le & lt)


def non_dominated_ranks(objectives: np.ndarray) -> np.ndarray:
    """Front index of every point (0 = not dominated by any point)."""
    dom = _dominates(objectives)
    n = len(dom)
    dominated_by = dom.sum(axis=0)
    ranks = np.full(n, -1, dtype=np.int64)
    front = np.flatnonzero(dominated_by == 0)
    rank = 0
    while len(front):
        ranks[front] = rank
        dominated_by = dominated_by - dom[front].sum(axis=0)
        dominated_by[ranks >= 0] = -1
        front = np.flatnonzero(dominated_by == 0)
        rank += 1
    return ranks


def crowding_distance(objectives: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Crowding distance within each point's front (sum over objectives of the normalised neighbour gap)."""
    f = np.asarray(objectives, dtype=np.float64)
    dist = np.zeros(len(f))
    for rank in np.unique(ranks):
        members = np.flatnonzero(ranks == rank)
        for m in range(f.shape[1]):
            values = f[members, m]
            order = members[np.argsort(values, kind="stable")]
            dist[order[0]] = dist[order[-1]] = np.inf
            span = values.max() - values.min()
            if len(order) > 2 and span > 0:
                dist[order[1:-1]] += (f[order[2:], m] - f[order[:-2], m]) / span
    return dist


def select_survivors(objectives: np.ndarray, count: int) -> np.ndarray:
    """Indices of the ``count`` survivors: whole fronts in rank order, the last one by decreasing crowding."""
    ranks = non_dominated_ranks(objectives)
    crowd = crowding_distance(objectives, ranks)
    order = np.lexsort((np.arange(len(ranks)), -crowd, ranks))
    return np.sort(order[:count])


def tournament(ranks: np.ndarray, crowd: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` parents, each the better of two uniformly drawn points (lower rank, then larger crowding)."""
    pairs = rng.integers(0, len(ranks), size=(count, 2))
    a, b = pairs[:, 0], pairs[:, 1]
    a_wins = (ranks[a] < ranks[b]) | (
        (ranks[a] == ranks[b]) & ((crowd[a] > crowd[b]) | ((crowd[a] == crowd[b]) & (a <= b)))
    )
    return np.where(a_wins, a, b)


def crossover(first: np.ndarray, second: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Uniform crossover: each gene swapped between the two parents with probability 1/2."""
    swap = rng.random(first.shape) < 0.5
    return np.where(swap, second, first), np.where(swap, first, second)


def mutate(genome: np.ndarray, choices: int, probability: float, rng: np.random.Generator) -> np.ndarray:
    """Each gene reset to a uniform value in ``[0, choices)`` with ``probability``."""
    reset = rng.random(genome.shape) < probability
    return np.where(reset, rng.integers(0, choices, size=genome.shape), genome)
