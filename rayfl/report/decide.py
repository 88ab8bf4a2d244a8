"""The project's rule for deciding an ordering between two methods from their per-seed figures.

A comparison gives each method one figure per seed (e.g. the mean of a run's last three evaluations). "A above B"
**holds** when the mean of A's figures exceeds the mean of B's by more than twice the larger of the two seed ranges
(max - min), is **reversed** when B's mean exceeds A's by more than that, and is **undecided** otherwise: a gap inside
the spread the seeds themselves produce is not a result. A method with no figure gives "not run".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

TAIL = 3  # a run's figure: the mean of its last three evaluations


def tail_mean(values: Sequence[float], last: int = TAIL) -> float:
    """The mean of the last ``last`` finite values of an evaluation curve (NaN when it has none)."""
    finite = [float(v) for v in values if not math.isnan(float(v))]
    tail = finite[-last:]
    return sum(tail) / len(tail) if tail else math.nan


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(mean, range) of the finite ``values``; (NaN, NaN) when there are none."""
    got = [float(v) for v in values if not math.isnan(float(v))]
    if not got:
        return math.nan, math.nan
    return sum(got) / len(got), max(got) - min(got)


def verdict(a: Sequence[float], b: Sequence[float]) -> tuple[str, float, float]:
    """("holds" | "reversed" | "undecided" | "not run", gap of the means A - B, the bar twice the larger range)."""
    mean_a, range_a = spread(a)
    mean_b, range_b = spread(b)
    if math.isnan(mean_a) or math.isnan(mean_b):
        return "not run", math.nan, math.nan
    gap, bar = mean_a - mean_b, 2 * max(range_a, range_b)
    if gap > bar:
        return "holds", gap, bar
    if -gap > bar:
        return "reversed", gap, bar
    return "undecided", gap, bar
