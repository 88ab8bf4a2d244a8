"""FedorAS's tiers, subspace sampling and path sampling, as pure numpy functions of per-op cost tables.

Paper 003 (Dudziak et al., FedorAS) and the official code (ALGORITHMS.md section 10):

* ``OpTables``: per searchable layer and candidate op, parameters and forward FLOPs per sample, plus the fixed
  (stem, reductions, head) costs; read off rayfl's cost model (measured on the meta device), so a path's cost is a sum
  of table entries and 100,000 paths cost one gather.
* ``tier_brackets`` (App. D.4, ``__generate_flops_tier_brackets``): sort the FLOPs of random paths, take their
  cumulative normalised sum, lower limit = the fixed FLOPs (or the ``low`` quantile of that sum), upper = the first
  FLOPs where it exceeds ``high``; split evenly; the top tier ends at the largest path's FLOPs.
* ``tiers_by_shares``: clients shuffled (seeded) and split by the tier shares (``__init_clustering``);
  ``tiers_by_compute``: clients ranked by compute speed and split by the same shares (App. I).
* ``sample_subspace`` (Eq. 2, ``__get_subspace``): one op pre-selected in each layer that has no identity, then the
  remaining non-identity ops removed in uniformly random order until the subspace's parameters fit the limit.
* ``sample_path`` (Eq. 3-4, ``Sampler.sample``): within the client's subspace and under its tier's FLOPs, first the
  layers without an identity, then the others in random order, each uniformly among the ops that still fit the
  remaining budget. One path per batch, from ``derive_rng(seed, "fedoras-path", round, client, batch)``.

Choice where the code is loose: a layer without an identity reserves the cheapest op of every later such layer before
it draws, so a path never exceeds the limit whenever any path fits (the official sampler may overdraw there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfl.core.rng import derive_rng

__all__ = [
    "OpTables",
    "novel_paths_in_bracket",
    "path_flops",
    "path_key",
    "path_rng",
    "random_paths",
    "sample_path",
    "sample_paths_in_bracket",
    "sample_subspace",
    "tier_brackets",
    "tiers_by_compute",
    "tiers_by_shares",
]


@dataclass(frozen=True)
class OpTables:
    """Per (layer, op) costs; ``valid[l, o]`` says layer ``l`` offers op ``o``; ``identity`` is the identity's op
    index (None when the space has none)."""

    params: np.ndarray  # (L, O)
    flops: np.ndarray  # (L, O), forward FLOPs per sample
    fixed_params: float
    fixed_flops: float
    identity: int | None

    @property
    def num_layers(self) -> int:
        return int(self.params.shape[0])

    @property
    def num_ops(self) -> int:
        return int(self.params.shape[1])

    def has_identity(self) -> np.ndarray:
        """(L,) layers whose identity op is a choice."""
        return np.full(self.num_layers, self.identity is not None)

    def subspace_params(self, mask: np.ndarray) -> float:
        return float(self.fixed_params + self.params[mask].sum())

    @property
    def min_flops(self) -> float:
        """FLOPs of the cheapest path (the official code's "fixed" cost: fixed layers plus the cheapest op each)."""
        return float(self.fixed_flops + self.flops.min(axis=1).sum())

    @property
    def max_flops(self) -> float:
        return float(self.fixed_flops + self.flops.max(axis=1).sum())


def path_flops(tables: OpTables, paths: np.ndarray) -> np.ndarray:
    """Forward FLOPs per sample of each path ((n, L) op indices)."""
    p = np.atleast_2d(np.asarray(paths, dtype=np.int64))
    return np.asarray(tables.fixed_flops + tables.flops[np.arange(tables.num_layers), p].sum(axis=1))


def random_paths(tables: OpTables, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` paths with every layer's op uniform among its ops."""
    return rng.integers(0, tables.num_ops, size=(count, tables.num_layers))


def tier_brackets(
    tables: OpTables, num_tiers: int, rng: np.random.Generator, num_paths: int, low: float = 0.0, high: float = 0.95
) -> np.ndarray:
    """``num_tiers + 1`` FLOPs edges: tier ``t`` is ``[edges[t], edges[t + 1]]`` (module docstring)."""
    flops = np.sort(path_flops(tables, random_paths(tables, num_paths, rng)))
    csum = np.cumsum(flops) / flops.sum()
    lower = tables.min_flops if low <= 0.0 else float(flops[np.searchsorted(csum, low, side="right")])
    upper = float(flops[min(len(flops) - 1, int(np.searchsorted(csum, high, side="right")))])
    edges = np.linspace(lower, upper, num_tiers + 1)
    edges[-1] = tables.max_flops
    return edges


def tiers_by_shares(num_clients: int, shares: tuple[float, ...], rng: np.random.Generator) -> np.ndarray:
    """Tier of every client: a seeded shuffle cut at the cumulative shares (the last tier takes the rounding)."""
    return _cut(rng.permutation(num_clients), shares)


def tiers_by_compute(speeds: np.ndarray, shares: tuple[float, ...], rng: np.random.Generator) -> np.ndarray:
    """Tier of every client from its compute speed: clients ranked slowest first (equal speeds in the order of a
    seeded shuffle) and cut at the cumulative shares, so a faster client is never in a lower tier than a slower one.
    With every speed equal this is ``tiers_by_shares`` with the same generator."""
    order = rng.permutation(len(speeds))
    return _cut(order[np.argsort(np.asarray(speeds, dtype=np.float64)[order], kind="stable")], shares)


def _cut(order: np.ndarray, shares: tuple[float, ...]) -> np.ndarray:
    cuts = np.round(np.cumsum(shares)[:-1] * len(order)).astype(np.int64)
    tiers = np.empty(len(order), dtype=np.int64)
    for t, group in enumerate(np.split(order, cuts)):
        tiers[group] = t
    return tiers


def sample_subspace(tables: OpTables, limit_params: float, rng: np.random.Generator) -> np.ndarray:
    """(L, O) mask of a subspace whose parameters (fixed layers included) are at most ``limit_params`` (Eq. 2)."""
    num_layers, num_ops = tables.num_layers, tables.num_ops
    mask = np.ones((num_layers, num_ops), dtype=bool)
    keep = np.zeros_like(mask)
    for layer in range(num_layers):
        if tables.identity is None:
            keep[layer, int(rng.integers(num_ops))] = True
        else:
            keep[layer, tables.identity] = True
    floor = tables.subspace_params(keep)
    if floor > limit_params:
        raise ValueError(f"fedoras: no subspace fits {limit_params:.0f} parameters (at least {floor:.0f} needed)")
    total = tables.subspace_params(mask)
    removable = np.argwhere(~keep)
    for k in rng.permutation(len(removable)):
        if total <= limit_params:
            break
        layer, op = removable[k]
        mask[layer, op] = False
        total -= float(tables.params[layer, op])
    return mask


def path_rng(seed: int, round_idx: int, client_id: int, batch_idx: int) -> np.random.Generator:
    """The generator of one client's path for one batch."""
    return derive_rng(seed, "fedoras-path", round_idx, client_id, batch_idx)


def sample_path(tables: OpTables, mask: np.ndarray, limit_flops: float, rng: np.random.Generator) -> np.ndarray:
    """One path (op per layer) inside the subspace ``mask`` whose FLOPs are at most ``limit_flops`` (Eq. 3-4)."""
    num_layers = tables.num_layers
    valid = np.asarray(mask, dtype=bool)
    no_identity = [layer for layer in range(num_layers) if tables.identity is None or not valid[layer, tables.identity]]
    cheapest = np.array([tables.flops[layer][valid[layer]].min() for layer in no_identity])
    budget = limit_flops - tables.fixed_flops - float(cheapest.sum())
    if budget < 0.0:
        raise ValueError(f"fedoras: no path of the subspace fits {limit_flops:.0f} FLOPs")
    path = np.empty(num_layers, dtype=np.int64)
    # layers without an identity first (in order), each reserving the cheapest op of the later ones
    for k, layer in enumerate(no_identity):
        room = budget + cheapest[k]
        ops = np.flatnonzero(valid[layer] & (tables.flops[layer] <= room))
        path[layer] = ops[int(rng.integers(len(ops)))]
        budget = room - float(tables.flops[layer, path[layer]])
    rest = [layer for layer in range(num_layers) if layer not in set(no_identity)]
    for layer in (rest[i] for i in rng.permutation(len(rest))):
        ops = np.flatnonzero(valid[layer] & (tables.flops[layer] <= budget))
        path[layer] = ops[int(rng.integers(len(ops)))]
        budget -= float(tables.flops[layer, path[layer]])
    return path


def sample_paths_in_bracket(
    tables: OpTables, count: int, low_flops: float, high_flops: float, rng: np.random.Generator
) -> np.ndarray:
    """``count`` paths (rows) of the whole space with FLOPs in ``[low_flops, high_flops]``: drawn by the budgeted
    sampler under the upper edge and kept when they reach the lower one (at most ``100 x count`` draws)."""
    full = np.ones_like(tables.params, dtype=bool)
    found: list[np.ndarray] = []
    for _ in range(100 * count):
        path = sample_path(tables, full, high_flops, rng)
        if path_flops(tables, path)[0] >= low_flops:
            found.append(path)
            if len(found) == count:
                return np.stack(found)
    raise ValueError(
        f"fedoras: found only {len(found)} of {count} paths in the bracket [{low_flops:.0f}, {high_flops:.0f}]"
    )


def path_key(path: np.ndarray) -> bytes:
    """A hashable key of one path (its op indices as int64 bytes)."""
    return np.asarray(path, dtype=np.int64).tobytes()


def novel_paths_in_bracket(
    tables: OpTables, count: int, low_flops: float, high_flops: float, rng: np.random.Generator, seen: set[bytes]
) -> np.ndarray:
    """Up to ``count`` distinct paths with FLOPs in ``[low_flops, high_flops]`` whose keys are not in ``seen`` (the
    official search's unique populations and random-search buckets): drawn as ``sample_paths_in_bracket`` draws, at
    most ``100 x count`` draws, so a bracket with fewer unseen paths gives fewer rows, shape ``(k, L)``."""
    full = np.ones_like(tables.params, dtype=bool)
    found: list[np.ndarray] = []
    keys = set(seen)
    for _ in range(100 * count):
        if len(found) == count:
            break
        path = sample_path(tables, full, high_flops, rng)
        key = path_key(path)
        if key not in keys and path_flops(tables, path)[0] >= low_flops:
            keys.add(key)
            found.append(path)
    return np.stack(found) if found else np.zeros((0, tables.num_layers), dtype=np.int64)
