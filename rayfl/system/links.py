"""Unstable links: transfers that stop at the first lost column (paper 004, FedResCuE, Sec. 3.3), for any method.

A model moves in ordered **transfer units**. A method exposes them through its assignment, with nothing
method-specific: a sub-model assignment with ``units`` (an elastic family's units per search dimension) is cut into
nested *levels*, level ``j`` being the leading block of the client's sub-model with ``min(units, uniform units at
j x column_ratio)`` units in every dimension (``column_levels``). For first-k methods (HeteroFL, FjORD, FedResCuE)
these are the global model's first-k columns ``x column_ratio``, ``x 2 column_ratio`` ...; for other selectors they
are the leading parts of whatever the client holds. The last level is the assignment itself. A model without an
elastic family is a single unit.

Per client and round an error rate ``er`` is drawn (``system.links.error_rate``, any per-client resource source,
a replayed trace of kind ``link_error`` included, at the round's simulated start or at its index; values in
``[0, 1)``) and, from ``derive_rng(seed, "links", round, client)``, how many units each direction delivers
before its first failure: each unit is lost independently with probability ``er``, so the run of delivered units is
geometric, ``P(run >= j) = (1 - er)^j``. A client with ``n`` levels receives ``p_d = min(n, run_down)`` levels and
the server receives ``p_u = min(L, run_up)`` of the ``L`` it trained. The unit that failed was sent too: bytes moved
count the delivered units plus the lost one (when one was lost).

``restrict_update`` cuts a trained update down to the levels that arrived (index intersection, so label-restricted
classifier rows and any selector keep working); the engine's reducer then averages each element over the clients
whose upload covered it, which for nested levels is paper 004's band-wise mean (Eq. 4) with weight 1 per client.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from rayfl.config.sections import LinkConfig
from rayfl.core.messages import Assignment, ClientUpdate, LinkDraw, TensorSlice
from rayfl.core.rng import derive_rng
from rayfl.models.elastic.spec import SubModelSpec
from rayfl.system.resources import TraceReplay, build_source

if TYPE_CHECKING:
    from rayfl.models.elastic.family import ElasticFamily

__all__ = [
    "LinkModel",
    "attempted",
    "column_levels",
    "delivered",
    "level_ratio",
    "restrict_update",
    "slice_numel",
]

_PERFECT = -1  # a run length meaning "no unit failed"


def delivered(run: int, num_levels: int) -> int:
    """Levels that arrive of ``num_levels`` sent in order, given the run of units delivered before the first loss."""
    return num_levels if run < 0 else min(num_levels, run)


def attempted(run: int, num_levels: int) -> int:
    """Levels put on the wire: the delivered ones plus the one that was lost (if one was)."""
    return num_levels if run < 0 else min(num_levels, run + 1)


class LinkModel:
    """Draws per client and round what its links deliver (see module docstring)."""

    def __init__(self, cfg: LinkConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.enabled = cfg.error_rate.source != "none"
        self.source = build_source(cfg.error_rate, "link_error", seed, "link_error")  # dimensionless, unit 1
        if isinstance(self.source, TraceReplay):
            for log in self.source.logs:
                bad = np.flatnonzero(~((log.values >= 0.0) & (log.values < 1.0)))
                if len(bad):
                    raise ValueError(
                        f"system.links.error_rate: trace {log.name} row {int(bad[0]) + 1} has error rate "
                        f"{float(log.values[bad[0]])!r}, outside [0, 1)"
                    )

    def draw(self, round_idx: int, clients: np.ndarray, t: float) -> list[LinkDraw | None]:
        """One ``LinkDraw`` per client (``None`` for all when links are perfect); ``t`` is the round's simulated start
        (a trace with ``trace_time: round`` is read at ``round_idx`` instead)."""
        if not self.enabled:
            return [None] * len(clients)
        at = float(round_idx) if self.cfg.trace_time == "round" else t
        rates = self.source.at(np.asarray(clients), at, round_idx)
        out: list[LinkDraw | None] = []
        for c, er in zip(clients, rates, strict=True):
            if not 0.0 <= er < 1.0:
                raise ValueError(f"system.links.error_rate: client {int(c)} drew error rate {er!r}, outside [0, 1)")
            rng = derive_rng(self.seed, "links", round_idx, int(c))
            down, up = (_run(rng, float(er)) for _ in range(2))
            cfg = self.cfg
            out.append(
                LinkDraw(
                    error_rate=float(er),
                    down_run=down,
                    up_run=up,
                    column_ratio=cfg.column_ratio,
                    padding=cfg.padding,
                    memory_dtype=cfg.memory_dtype,
                )
            )
        return out


def _run(rng: np.random.Generator, error_rate: float) -> int:
    """Units delivered before the first loss (each lost with ``error_rate``); ``-1`` when none can be lost."""
    if error_rate <= 0.0:
        return _PERFECT
    return int(rng.geometric(error_rate)) - 1  # trials up to and including the first loss, minus that loss


def _uniform_units(family: ElasticFamily, ratio: float) -> tuple[int, ...]:
    space = family.space
    return space.units(SubModelSpec.uniform(space, min(1.0, ratio)).ratios)


def column_levels(family: ElasticFamily | None, assignment: Assignment, column_ratio: float) -> list[Assignment]:
    """The assignment's nested transfer levels, smallest first; the last is ``assignment`` itself."""
    if family is None:
        return [assignment]
    own = family.full_units if assignment.units is None else tuple(int(u) for u in assignment.units)
    levels: list[Assignment] = []
    for j in range(1, math.ceil(1.0 / column_ratio - 1e-9) + 1):
        units = tuple(min(o, u) for o, u in zip(own, _uniform_units(family, j * column_ratio), strict=True))
        if units == own:
            break
        if not levels or levels[-1].units != units:
            levels.append(_leading(assignment, family, units))
    levels.append(assignment)
    return levels


def _leading(space_assignment: Assignment, family: ElasticFamily, units: tuple[int, ...]) -> Assignment:
    """The leading block of ``space_assignment``'s sub-model with ``units`` units per dimension."""
    space = family.space
    slices: dict[str, TensorSlice] = {}
    skip = set(space_assignment.skip)
    for name, layout in space.layouts.items():
        if name in skip:
            continue
        if not space.present(name, units):
            skip.add(name)
            continue
        sub = space.sub_shape(name, units)
        old = space_assignment.slices.get(name)
        parts: list[np.ndarray | None] = []
        for axis, length in enumerate(sub):
            idx = None if old is None else old.index[axis]
            if idx is None:
                parts.append(None if length == layout.shape[axis] else np.arange(length, dtype=np.int64))
            else:
                parts.append(np.asarray(idx[:length], dtype=np.int64))
        slices[name] = TensorSlice(tuple(parts))
    return dataclasses.replace(space_assignment, slices=slices, skip=frozenset(skip), units=units)


def level_ratio(family: ElasticFamily | None, levels: Sequence[Assignment], level: int) -> float:
    """The width ratio of the first ``level`` levels: the largest per-dimension fraction of units (0 for none)."""
    if level <= 0:
        return 0.0
    units = levels[level - 1].units
    if family is None or units is None:
        return 1.0
    sizes = np.asarray(family.full_units, dtype=np.float64)
    return float(np.max(np.asarray(units, dtype=np.float64) / sizes))


def slice_numel(shapes: Mapping[str, tuple[int, ...]], assignment: Assignment) -> int:
    """Elements an assignment moves: its slice of every tensor it does not skip (the cost oracle's count)."""
    total = 0
    for name, shape in shapes.items():
        if name in assignment.skip:
            continue
        tslice = assignment.slices.get(name)
        if tslice is None:
            total += int(np.prod(shape))
        else:
            total += int(np.prod([s if i is None else len(i) for s, i in zip(shape, tslice.index, strict=True)]))
    return total


def restrict_update(update: ClientUpdate, level: Assignment, shapes: Mapping[str, torch.Size]) -> ClientUpdate:
    """The part of ``update`` inside ``level``: per tensor, the positions whose global indices ``level`` covers on
    every axis (tensors ``level`` skips are dropped)."""
    values: dict[str, torch.Tensor] = {}
    slices: dict[str, TensorSlice] = {}
    for name, value in update.values.items():
        if name in level.skip:
            continue
        upd = update.slices.get(name)
        cut = level.slices.get(name)
        if cut is None:
            values[name] = value
            if upd is not None:
                slices[name] = upd
            continue
        out = value
        parts: list[np.ndarray | None] = []
        for axis, size in enumerate(shapes[name]):
            given = None if upd is None else upd.index[axis]
            have: np.ndarray = np.arange(size, dtype=np.int64) if given is None else given
            want = cut.index[axis]
            if want is None:
                parts.append(None if upd is None or upd.index[axis] is None else have)
                continue
            keep = np.isin(have, want)
            if not keep.all():
                out = out.index_select(axis, torch.as_tensor(np.flatnonzero(keep), dtype=torch.long))
            parts.append(np.asarray(have[keep], dtype=np.int64))
        values[name] = out.clone() if out is value else out
        slices[name] = TensorSlice(tuple(parts))
    return dataclasses.replace(update, values=values, slices=slices)
