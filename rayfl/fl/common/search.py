"""Resource-constrained model search (paper 000, Sec. 3.2 and Algorithm 2, lines 7-19).

Per round and per sampled client (in client-id order), the server

1. picks from the sampling pool ``P`` the member with the largest *criterion* (parameters by default) that fits the
   client's budgets: ``peak_memory <= memory_budget`` and ``bytes_down + bytes_up <= bandwidth_budget``;
2. then, while a uniform draw ``u`` exceeds ``epsilon`` and fewer than ``t_max`` structures were drawn, samples a
   structure uniformly from the whole space (each layer uniformly from its allowed ratios), adds it to ``P`` and
   adopts it if it fits and its criterion is strictly larger than the current choice's. ``epsilon`` here is
   Algorithm 2's threshold (line 9), so the search explores with probability ``1 - epsilon`` per test; the method's
   config names the probability itself (``explore_probability``, whose docstring gives the paper's two readings);
3. falls back to the smallest structure when nothing fits (reported with ``fits=False``; never an error, unlike the
   Plato prototype's ``max_loop``). When the smallest is a named model (Table 2's smallest client model, larger than
   the space's own smallest structure), a client that fits nothing in the pool gets the space's smallest structure
   if that fits (Sec. 3.2: "in the worst cases, the smallest model will be chosen to meet current sampling
   requirements"), else the named one with ``fits=False``.

``P`` persists across rounds and starts as {smallest, largest}. A client reaching ``t_max`` draws is a *hit* (the
paper's hit rate, App. E.1).

Choices this implementation makes where the paper is open:

* **Ratios.** A structure gives every *layer* a ratio from ``S``; a layer is one dimension, or a group of dimensions
  that share one ratio (``groups``: a transformer block's heads and MLP width at the paper's granularity). 0 (the
  block removed) is allowed only for skippable layers, the others draw from the positive ratios of ``S`` only. The
  smallest structure sets every dimension to its smallest allowed ratio unless ``smallest`` names one (Table 2's
  smallest client model), the largest to ``max(S)`` (1 in every setting of the paper). Structures are kept as unit
  counts (``SearchSpace.units``), so two ratios that round to the same width are the same structure.
* **Pool admission.** ``admit="all"`` (default) follows Algorithm 2, line 11: *every* sampled structure enters ``P``,
  including ones that do not fit the client that sampled them (they may fit a later, richer client).
  ``admit="fitting"`` follows the prose of Sec. 3.2 ("add it to the pool if it meets the constraints").
* **Ties.** ``P`` is ordered by criterion descending, then by insertion order; the pick is the first member in that
  order that fits. A sampled structure replaces the current choice only when its criterion is strictly larger.
* **Random draws.** Client ``c`` in round ``r`` uses ``derive_rng(seed, "search", r, c)``, read as the sequential
  algorithm reads it: one uniform ``u`` for the epsilon test, then ``G`` uniforms ``x`` for a structure (layer
  ``g`` takes its allowed ratio number ``floor(x[g] * n_allowed[g])``; ``G = D`` without groups), then the next
  ``u``, and so on. A client's result therefore depends only on its budgets, the pool and its own generator, not on
  which other clients share its round (except through the pool they grew before it).

Speed: the draws of a whole round are made up front (``t_max`` rows of ``1 + D`` uniforms per client, of which only
the rows the epsilon test lets through are used, exactly as the sequential loop would), the round's new structures are
costed with one ``CostModel.evaluate`` call (each structure is costed once and its costs cached in the pool), and
every client's choice is a handful of array operations over all clients at once: the pool is kept in lookup order,
so the pick is the first ``True`` of a (clients x pool) fit mask; the structures that earlier clients of the same
round add are handled by a (clients x new structures) mask. The result equals the sequential algorithm's (the tests
compare with a plain sequential implementation). ``benchmarks/search.py`` measures a round of 120 clients on
ResNet152.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rayfl.core.messages import ClientView
from rayfl.core.rng import derive_rng
from rayfl.models.elastic.cost import CostModel, Costs, units_from_ratios
from rayfl.models.elastic.family import ElasticFamily
from rayfl.models.elastic.space import SearchSpace, units_for

__all__ = ["ClientChoice", "ModelSearch", "SearchPool", "SearchResult", "named_structure"]

Criterion = Literal["params", "memory", "bytes"]


@dataclass(frozen=True, slots=True)
class ClientChoice:
    """One client's structure for the round and how it was found."""

    client_id: int
    units: tuple[int, ...]  # unit count per search dimension
    fits: bool  # False only for the smallest-structure fallback when even that exceeds a budget
    draws: int  # structures sampled for this client (at most t_max)
    hit: bool  # the search stopped at t_max draws, not at a draw <= epsilon (every client hits when t_max = 0)
    params: float
    peak_memory: float
    comm_bytes: float  # bytes_down + bytes_up


@dataclass(frozen=True)
class SearchPool:
    """The search's state across rounds: the pool's structures in insertion order, and the distinct structures
    assigned so far (sorted). Costs and lookup order are rebuilt from these with the cost model (``ModelSearch``'s
    ``pool_state`` and ``load_pool``), so a resumed search continues exactly."""

    units: np.ndarray  # (pool size, D) unit counts
    assigned: np.ndarray  # (distinct assigned, D) unit counts


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A round's choices (in client-id order) and statistics."""

    round_idx: int
    choices: tuple[ClientChoice, ...]
    search_s: float  # wall-clock seconds of ``assign_round``
    distinct_assigned: int  # distinct structures assigned so far (all rounds)
    hit_rate: float  # fraction of this round's clients that reached t_max (0 for an empty round)
    pool_size: int  # |P| after the round
    new_structures: int  # structures that entered P this round

    def by_client(self) -> dict[int, ClientChoice]:
        return {c.client_id: c for c in self.choices}


def named_structure(family: ElasticFamily, ratio: float, blocks: Sequence[int]) -> tuple[int, ...]:
    """Unit counts of a named smaller model inside ``family``'s space: every dimension at ``ratio`` and, in stage
    ``s``, only the first ``blocks[s]`` blocks (the rest removed: their removing dimension at 0 units); empty
    ``blocks`` keeps every block. Paper 000's Table 2 names a smallest client model per setting: ResNet18 inside
    ResNet34 or ResNet152 (two blocks per stage), ViT-tiny-tiny (ViT-tiny with one block). Raises ``ValueError``
    naming what does not fit the family (wrong number of stages, more blocks than a stage has, a block that cannot
    be removed)."""
    space = family.space
    units = [units_for(d, ratio) for d in space.dims]
    if not blocks:
        return tuple(units)
    stages = family.stage_blocks()
    if len(blocks) != len(stages):
        raise ValueError(f"blocks needs one count per stage of the model ({len(stages)}), got {list(blocks)}")
    for s, (keep, stage) in enumerate(zip(blocks, stages, strict=True)):
        if not 0 <= keep <= len(stage):
            raise ValueError(f"blocks[{s}] = {keep}: stage {s + 1} has {len(stage)} blocks")
        for b, dims in enumerate(stage[keep:], start=keep):
            removable = [d for d in dims if space.dims[d].skippable]
            if not removable:
                raise ValueError(f"blocks[{s}] = {keep}: block {b} of stage {s + 1} cannot be removed")
            for d in removable:
                units[d] = 0
    return tuple(units)


class ModelSearch:
    """The sampling pool and the per-round search of Algorithm 2 (see module docstring)."""

    def __init__(
        self,
        space: SearchSpace,
        cost: CostModel,
        ratios: Sequence[float],
        *,
        epsilon: float = 0.8,
        t_max: int = 5,
        criterion: Criterion = "params",
        admit: Literal["all", "fitting"] = "all",
        groups: Sequence[Sequence[int]] | None = None,
        smallest: Sequence[int] | None = None,
        seed: int,
    ) -> None:
        """``groups``: the dimensions each layer's one ratio covers (every dimension exactly once; None = one layer
        per dimension). ``smallest``: the smallest structure's unit counts (None = every dimension at its smallest
        allowed ratio); when it is given and a client fits nothing in the pool, the client gets the space's own
        smallest structure if that fits (``floor``: "in the worst cases, the smallest model will be chosen to meet
        current sampling requirements", Sec. 3.2), else ``smallest`` (``fits=False``)."""
        s = sorted({float(r) for r in ratios})
        if not s or s[0] < 0.0 or s[-1] > 1.0 or s[-1] <= 0.0:
            raise ValueError(f"ratios must lie in [0, 1] and include a positive value, got {list(ratios)}")
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must lie in [0, 1], got {epsilon}")
        if t_max < 0:
            raise ValueError(f"t_max must be >= 0, got {t_max}")
        if criterion not in ("params", "memory", "bytes"):
            raise ValueError(f"unknown criterion {criterion!r}")
        if admit not in ("all", "fitting"):
            raise ValueError(f"unknown admit rule {admit!r}")
        if cost.num_dims != len(space.dims):
            raise ValueError(f"cost model has {cost.num_dims} dimensions, the space {len(space.dims)}")
        self.space = space
        self.cost = cost
        self.ratios = tuple(s)
        self.epsilon = float(epsilon)
        self.t_max = int(t_max)
        self.criterion: Criterion = criterion
        self.admit = admit
        self.seed = int(seed)
        self.num_dims = len(space.dims)

        positive = [r for r in s if r > 0.0]
        skippable = space.skippable
        layers = [[d] for d in range(self.num_dims)] if groups is None else [list(g) for g in groups]
        if sorted(d for g in layers for d in g) != list(range(self.num_dims)) or any(not g for g in layers):
            raise ValueError(f"groups must cover each of the {self.num_dims} dimensions exactly once")
        if any(len({bool(skippable[d]) for d in g}) > 1 for g in layers):
            raise ValueError("the dimensions of a group must all be skippable or all not")
        self.groups: tuple[tuple[int, ...], ...] = tuple(tuple(g) for g in layers)
        self.layer_of = np.empty(self.num_dims, dtype=np.int64)  # the layer (group) of every dimension
        for k, g in enumerate(layers):
            self.layer_of[g] = k
        allowed = [s if skippable[d] else positive for d in range(self.num_dims)]
        self.num_allowed = np.array([len(a) for a in allowed], dtype=np.int64)
        self.num_layers = len(layers)
        self.layer_allowed = self.num_allowed[[g[0] for g in layers]]  # (G,) allowed ratios per layer
        width = int(self.num_allowed.max())
        table = np.array([a + [a[-1]] * (width - len(a)) for a in allowed], dtype=np.float64)  # (D, K) ratios
        self.allowed_ratios: tuple[tuple[float, ...], ...] = tuple(tuple(a) for a in allowed)
        self._unit_table = units_from_ratios(table.T, space.sizes, skippable).T.copy()  # (D, K) unit counts
        self._dim_index = np.arange(self.num_dims)[None, :]

        if smallest is None:
            low = self._unit_table[:, 0].copy()
        else:
            low = np.asarray(smallest, dtype=np.int64).copy()
            if low.shape != (self.num_dims,) or (low < 0).any() or (low > space.sizes).any():
                raise ValueError(f"smallest must give 0..size units for each of the {self.num_dims} dimensions")
        floor = self._unit_table[:, 0].copy()
        self.floor: tuple[int, ...] = tuple(int(u) for u in floor)
        self._floor_costs = tuple(float(c[0]) for c in self._costs(floor[None, :]))  # params, memory, traffic
        largest = units_from_ratios(np.full((1, self.num_dims), s[-1]), space.sizes, skippable)[0]
        self.smallest: tuple[int, ...] = tuple(int(u) for u in low)
        self.largest: tuple[int, ...] = tuple(int(u) for u in largest)

        # The pool, in insertion order (id = row): unit counts and cached costs.
        self._index: dict[bytes, int] = {}
        self._units = np.empty((0, self.num_dims), dtype=np.int64)
        self._params = np.empty(0)
        self._memory = np.empty(0)
        self._comm = np.empty(0)
        self._order = np.empty(0, dtype=np.int64)  # pool ids in lookup order: criterion descending, then id
        self._crit_sorted = np.empty(0)  # the pool's criterion, memory and traffic in lookup order
        self._memory_sorted = np.empty(0)
        self._comm_sorted = np.empty(0)
        self._assigned: set[bytes] = set()
        initial = np.stack([low, largest] if self.smallest != self.largest else [low])
        self._add(initial, self._costs(initial))

    # ------------------------------------------------------------------------------------------ pool
    @property
    def pool_size(self) -> int:
        return len(self._index)

    @property
    def distinct_assigned(self) -> int:
        return len(self._assigned)

    def pool(self) -> list[tuple[int, ...]]:
        """The pool's structures, in lookup order (criterion descending, then insertion order)."""
        return [tuple(int(u) for u in self._units[i]) for i in self._order]

    def pool_state(self) -> SearchPool:
        """A copy of the pool and the assigned structures (``SearchPool``)."""
        assigned = sorted(self._assigned)
        rows = [np.frombuffer(b, dtype=np.int64) for b in assigned]
        return SearchPool(
            self._units.copy(),
            np.stack(rows) if rows else np.empty((0, self.num_dims), dtype=np.int64),
        )

    def load_pool(self, pool: SearchPool) -> None:
        """Replace the pool and the assigned structures by ``pool``'s (costs recomputed with the cost model)."""
        units = np.asarray(pool.units, dtype=np.int64).reshape(-1, self.num_dims)
        self._index = {}
        self._units = np.empty((0, self.num_dims), dtype=np.int64)
        self._params, self._memory, self._comm = np.empty(0), np.empty(0), np.empty(0)
        self._order = np.empty(0, dtype=np.int64)
        self._crit_sorted, self._memory_sorted, self._comm_sorted = np.empty(0), np.empty(0), np.empty(0)
        self._add(units, self._costs(units))
        assigned = np.asarray(pool.assigned, dtype=np.int64).reshape(-1, self.num_dims)
        self._assigned = {np.ascontiguousarray(row).tobytes() for row in assigned}

    def _crit(self, params: np.ndarray, memory: np.ndarray, comm: np.ndarray) -> np.ndarray:
        if self.criterion == "params":
            return params
        return memory if self.criterion == "memory" else comm

    def _costs(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c: Costs = self.cost.evaluate(units)
        return c.params, c.peak_memory, c.bytes_down + c.bytes_up

    def _add(self, units: np.ndarray, costs: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Append new (distinct, not yet pooled) structures, keeping the lookup order."""
        if not len(units):
            return
        start = len(self._index)
        for k, row in enumerate(units):
            self._index[row.tobytes()] = start + k
        self._units = np.concatenate([self._units, units])
        self._params = np.concatenate([self._params, costs[0]])
        self._memory = np.concatenate([self._memory, costs[1]])
        self._comm = np.concatenate([self._comm, costs[2]])
        # New ids are larger than every pooled id, so each goes after the pooled members of equal criterion.
        crit = self._crit(*costs)
        new_order = np.lexsort((np.arange(len(crit)), -crit))
        at = np.searchsorted(-self._crit_sorted, -crit[new_order], side="right")
        self._order = np.insert(self._order, at, start + new_order)
        self._crit_sorted = self._crit(self._params, self._memory, self._comm)[self._order]
        self._memory_sorted = self._memory[self._order]
        self._comm_sorted = self._comm[self._order]

    # ------------------------------------------------------------------------------------------ search
    def assign_round(self, views: Sequence[ClientView], round_idx: int) -> SearchResult:
        """Choose a structure for every client of the round (Algorithm 2, lines 6-19)."""
        t0 = time.perf_counter()
        clients = sorted(views, key=lambda v: v.client_id)
        ids = [v.client_id for v in clients]
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate client ids in the round")
        n, d, t_max = len(clients), self.num_layers, self.t_max
        mem_b = np.array([v.memory_budget for v in clients], dtype=np.float64)
        comm_b = np.array([v.bandwidth_budget for v in clients], dtype=np.float64)

        # Every client's epsilon draws and structure draws, read in the sequential order: row k of a client's block
        # is (u_k, x_k), and the loop uses rows 0..k-1 where u_k is its first draw <= epsilon (at most t_max rows).
        block = np.empty((n, t_max, 1 + d))
        for i, cid in enumerate(ids):
            derive_rng(self.seed, "search", round_idx, cid).random(out=block[i])
        go = block[:, :, 0] > self.epsilon
        draws = np.where(go.all(axis=1), t_max, go.argmin(axis=1)) if t_max else np.zeros(n, dtype=np.int64)
        m = int(draws.sum())
        owner = np.repeat(np.arange(n), draws)
        first_row = np.cumsum(draws) - draws
        x = block[:, :, 1:][np.arange(t_max)[None, :] < draws[:, None]]  # (m, D), client by client, draw by draw
        pick = np.minimum((x * self.layer_allowed).astype(np.int64), self.layer_allowed - 1)  # (m, G)
        cand = np.ascontiguousarray(self._unit_table[self._dim_index, pick[:, self.layer_of]])  # (m, D) unit counts

        # Candidate costs: pooled structures from the cache, the others with one cost-model call.
        keys = [row.tobytes() for row in cand]
        pooled = np.array([self._index.get(k, -1) for k in keys], dtype=np.int64)
        c_params, c_mem, c_comm = np.empty(m), np.empty(m), np.empty(m)
        known = pooled >= 0
        c_params[known], c_mem[known], c_comm[known] = (
            self._params[pooled[known]],
            self._memory[pooled[known]],
            self._comm[pooled[known]],
        )
        unknown = np.flatnonzero(~known)
        if len(unknown):
            first: dict[bytes, int] = {}
            slot = np.array([first.setdefault(keys[j], len(first)) for j in unknown], dtype=np.int64)
            distinct = unknown[np.unique(slot, return_index=True)[1]]  # each new structure costed once
            costs = self._costs(cand[distinct])
            c_params[unknown], c_mem[unknown], c_comm[unknown] = (c[slot] for c in costs)
        c_crit = self._crit(c_params, c_mem, c_comm)
        fit_own = (c_mem <= mem_b[owner]) & (c_comm <= comm_b[owner])

        # The structures that enter the pool this round, in order of appearance (first occurrence only).
        entering: list[int] = []
        seen: set[bytes] = set()
        for j in unknown:
            if (self.admit == "all" or fit_own[j]) and keys[j] not in seen:
                seen.add(keys[j])
                entering.append(int(j))
        new = np.array(entering, dtype=np.int64)

        # Line 7: the first fitting pool member, where the pool is the round's starting pool plus what earlier
        # clients of this round added (those come after every starting member in pool order).
        fits = (self._memory_sorted[None, :] <= mem_b[:, None]) & (self._comm_sorted[None, :] <= comm_b[:, None])
        found = fits.any(axis=1)
        at = fits.argmax(axis=1)
        best = np.where(found, self._crit_sorted[at], -np.inf)
        pool_id = np.where(found, self._order[at], 0)  # id 0 = the smallest structure (the fallback)
        row = np.full(n, -1, dtype=np.int64)  # a candidate row of this round, when the choice is one
        if len(new):
            earlier = owner[new][None, :] < np.arange(n)[:, None]
            ok = earlier & (c_mem[new][None, :] <= mem_b[:, None]) & (c_comm[new][None, :] <= comm_b[:, None])
            score = np.where(ok, c_crit[new][None, :], -np.inf)
            j = score.argmax(axis=1)
            top = score[np.arange(n), j]
            better = top > best
            best = np.where(better, top, best)
            row = np.where(better, new[j], row)
        # Lines 9-19: adopt the first own draw with the largest criterion among those that fit, if larger.
        if m:
            own = np.full((n, t_max), -np.inf)
            own[owner, np.arange(m) - first_row[owner]] = np.where(fit_own, c_crit, -np.inf)
            k = own.argmax(axis=1)
            top = own[np.arange(n), k]
            better = top > best
            best = np.where(better, top, best)
            row = np.where(better, first_row + k, row)
        fitted = best > -np.inf

        from_row = row >= 0
        chosen = self._units[pool_id]
        params, memory, comm = self._params[pool_id], self._memory[pool_id], self._comm[pool_id]
        if from_row.any():
            r = row[from_row]
            chosen[from_row], params[from_row], memory[from_row], comm[from_row] = (
                cand[r],
                c_params[r],
                c_mem[r],
                c_comm[r],
            )
        # Nothing fits: the space's own smallest structure when the pool's smallest is a larger named model
        f_params, f_mem, f_comm = self._floor_costs
        floored = ~fitted & (f_mem <= mem_b) & (f_comm <= comm_b) & (self.floor != self.smallest)
        if floored.any():
            chosen[floored] = np.asarray(self.floor)
            params[floored], memory[floored], comm[floored] = f_params, f_mem, f_comm
            fitted = fitted | floored

        if len(new):
            self._add(cand[new], (c_params[new], c_mem[new], c_comm[new]))
        self._assigned.update(r.tobytes() for r in chosen)
        hits = draws >= t_max
        unit_lists = chosen.tolist()
        choices = tuple(
            ClientChoice(
                client_id=cid,
                units=tuple(unit_lists[i]),
                fits=bool(fitted[i]),
                draws=int(draws[i]),
                hit=bool(hits[i]),
                params=float(params[i]),
                peak_memory=float(memory[i]),
                comm_bytes=float(comm[i]),
            )
            for i, cid in enumerate(ids)
        )
        return SearchResult(
            round_idx=round_idx,
            choices=choices,
            search_s=time.perf_counter() - t0,
            distinct_assigned=len(self._assigned),
            hit_rate=float(hits.mean()) if n else 0.0,
            pool_size=len(self._index),
            new_structures=len(new),
        )
