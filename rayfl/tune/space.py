"""The swept parameters of a sweep: how a ``param_space`` entry is written, expanded and handed to Tune.

A ``param_space`` entry maps a dotted experiment key (``algorithm.epsilon``, ``seed``) to

* a list, or ``{grid: [...]}``: every value, crossed with the other grids (a grid search);
* ``{choice: [...]}``: one value drawn per sample; ``{uniform: [lo, hi]}``, ``{loguniform: [lo, hi]}`` (``0 < lo``):
  a float drawn per sample; ``{randint: [lo, hi]}``: an integer in ``[lo, hi)`` (Tune's convention).

Drawn values need ``search: random``; Tune then makes ``num_samples`` draws per grid point. A trial's values become
``key=value`` overrides of the base experiment (values written as JSON, which YAML reads back unchanged), keys ending
in ``name`` first so that switching a tagged section (``algorithm.name``) happens before its other keys are set.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rayfl.core.errors import KeyPath
from rayfl.experiment.loader import YamlSource

__all__ = [
    "DISTRIBUTIONS",
    "Param",
    "grid_points",
    "parse_param",
    "plain",
    "point_label",
    "trial_overrides",
    "tune_space",
    "validation_points",
]

Kind = Literal["grid", "choice", "uniform", "loguniform", "randint"]
DISTRIBUTIONS: tuple[Kind, ...] = ("grid", "choice", "uniform", "loguniform", "randint")
_WRITTEN = (
    "a list (grid) or one of {grid: [...]}, {choice: [...]}, {uniform: [lo, hi]}, {loguniform: [lo, hi]}, "
    "{randint: [lo, hi]}"
)


@dataclass(frozen=True)
class Param:
    """One swept key: its values (grid, choice) or its range (uniform, loguniform, randint with ``high`` excluded)."""

    key: str
    kind: Kind
    values: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0

    @property
    def sampled(self) -> bool:
        return self.kind != "grid"

    def candidates(self) -> tuple[Any, ...]:
        """The values checked before the sweep starts: every listed value, or both ends of a range."""
        if self.kind in ("grid", "choice"):
            return self.values
        if self.kind == "randint":
            return (int(self.low), int(self.high) - 1)
        return (self.low, self.high)

    def to_tune(self) -> Any:
        """Tune's search-space object for this entry."""
        from ray import tune

        if self.kind == "grid":
            return tune.grid_search(list(self.values))
        if self.kind == "choice":
            return tune.choice(list(self.values))
        if self.kind == "uniform":
            return tune.uniform(self.low, self.high)
        if self.kind == "loguniform":
            return tune.loguniform(self.low, self.high)
        return tune.randint(int(self.low), int(self.high))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_param(key: str, value: Any, source: YamlSource, at: KeyPath) -> Param:
    """Read the ``param_space`` entry ``key: value`` found at ``at`` of ``source``; errors name file and line."""
    if isinstance(value, list):
        return _listed(key, "grid", value, source, at)
    if not isinstance(value, Mapping) or len(value) != 1:
        raise source.error(at, f"expected {_WRITTEN}, got {_describe(value)}")
    ((kind, arg),) = value.items()
    where = (*at, str(kind))
    if kind not in DISTRIBUTIONS:
        raise source.error(where, f"unknown distribution '{kind}'; use one of {', '.join(DISTRIBUTIONS)}")
    if kind in ("grid", "choice"):
        if not isinstance(arg, list):
            raise source.error(where, f"{kind} takes a list of values, got {_describe(arg)}")
        return _listed(key, kind, arg, source, where)
    if not (isinstance(arg, list) and len(arg) == 2 and all(_number(v) for v in arg)):
        raise source.error(where, f"{kind} takes [low, high] (two numbers), got {_describe(arg)}")
    low, high = arg
    if kind == "randint" and not all(isinstance(v, int) for v in arg):
        raise source.error(where, f"randint takes two integers [low, high), got {arg}")
    if not low < high:
        raise source.error(where, f"{kind} needs low < high, got [{low}, {high}]")
    if kind == "loguniform" and low <= 0:
        raise source.error(where, f"loguniform needs 0 < low, got {low}")
    return Param(key, kind, low=low, high=high)


def _listed(key: str, kind: Kind, values: list[Any], source: YamlSource, at: KeyPath) -> Param:
    if not values:
        raise source.error(at, f"{kind} needs at least one value")
    seen: list[str] = []
    for index, v in enumerate(values):
        text = json.dumps(v, sort_keys=True)
        if text in seen:
            raise source.error((*at, index), f"value {v!r} is listed twice (it would run the same trial twice)")
        seen.append(text)
    return Param(key, kind, values=tuple(values))


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping with keys " + ", ".join(repr(k) for k in value) if value else "an empty mapping"
    if isinstance(value, list):
        return f"a list {value!r}"
    return f"{type(value).__name__} {value!r}"


def grid_points(params: Sequence[Param]) -> list[dict[str, Any]]:
    """Every combination of the grid entries, the first entry varying slowest (``[{}]`` without grids)."""
    grids = [p for p in params if not p.sampled]
    return [
        dict(zip([p.key for p in grids], combo, strict=True)) for combo in itertools.product(*(p.values for p in grids))
    ]


def validation_points(params: Sequence[Param]) -> list[dict[str, Any]]:
    """Points that cover every value a trial can get: each grid point with the drawn entries at their first candidate,
    and each candidate of each drawn entry with the grids at their first point."""
    first = {p.key: p.candidates()[0] for p in params if p.sampled}
    points = [{**g, **first} for g in grid_points(params)]
    for p in params:
        if p.sampled:
            points += [{**points[0], p.key: c} for c in p.candidates()[1:]]
    return points


def tune_space(params: Sequence[Param]) -> dict[str, Any]:
    """Tune's ``param_space``: flat, keyed by the dotted experiment keys."""
    return {p.key: p.to_tune() for p in params}


def plain(value: Any) -> Any:
    """A value Tune handed back as plain Python (numpy scalars become ints and floats, tuples lists)."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def trial_overrides(point: Mapping[str, Any]) -> list[str]:
    """``key=value`` overrides for a trial's values, ``*.name`` keys first (they reset their section's variant)."""
    keys = sorted(point, key=lambda k: 0 if k.rsplit(".", 1)[-1] == "name" else 1)
    return [f"{k}={json.dumps(plain(point[k]))}" for k in keys]


def point_label(point: Mapping[str, Any], max_len: int = 80) -> str:
    """A short, file-name-safe label of a trial's values: ``epsilon=0.2,t_max=5`` (last part of each key)."""
    parts = []
    for key, value in point.items():
        v = plain(value)
        text = f"{v:.4g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, list | dict) else str(v)
        parts.append(f"{key.rsplit('.', 1)[-1]}={text}")
    label = re.sub(r"[^A-Za-z0-9._=,+-]", "", ",".join(parts))
    return label[:max_len] or "trial"
