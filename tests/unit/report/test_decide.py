"""The decision rule every paper table uses (``rayfl.report.decide``)."""

from __future__ import annotations

import math

import pytest

from rayfl.report.decide import spread, tail_mean, verdict


def test_tail_mean_is_the_mean_of_the_last_three_finite_evaluations() -> None:
    assert tail_mean([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(0.4)
    assert tail_mean([0.1, 0.2, math.nan, 0.5]) == pytest.approx((0.1 + 0.2 + 0.5) / 3)
    assert tail_mean([0.7]) == pytest.approx(0.7)
    assert math.isnan(tail_mean([]))


@pytest.mark.parametrize(
    ("a", "b", "word"),
    [
        # gap 0.10, ranges 0.02 and 0.04: bar 0.08 < gap
        ([0.60, 0.61, 0.62], [0.50, 0.52, 0.54], "holds"),
        ([0.50, 0.52, 0.54], [0.60, 0.61, 0.62], "reversed"),
        # gap 0.05, bar 0.08: inside the seeds' own spread
        ([0.55, 0.56, 0.57], [0.50, 0.52, 0.54], "undecided"),
        # A ahead in every seed still does not decide when the seeds spread more than half the gap
        ([0.70, 0.80, 0.90], [0.60, 0.70, 0.80], "undecided"),
    ],
)
def test_an_ordering_is_decided_only_by_a_gap_over_twice_the_larger_seed_range(
    a: list[float], b: list[float], word: str
) -> None:
    got, gap, bar = verdict(a, b)
    assert got == word, (a, b, gap, bar)
    assert gap == pytest.approx(spread(a)[0] - spread(b)[0])
    assert bar == pytest.approx(2 * max(spread(a)[1], spread(b)[1]))


def test_a_gap_equal_to_the_bar_is_not_decided() -> None:
    assert verdict([1.0, 3.0], [0.0, 0.0]) == ("undecided", 2.0, 4.0)  # A's range 2: the bar is 4
    assert verdict([4.0, 6.0], [0.0, 0.0]) == ("holds", 5.0, 4.0)
    assert verdict([4.0, 4.0], [2.0, 2.0])[0] == "holds"  # no spread at all: any gap decides
    assert verdict([4.0, 6.0], [1.0, 1.0]) == ("undecided", 4.0, 4.0)


def test_a_method_without_figures_is_not_run() -> None:
    assert verdict([], [0.5, 0.6, 0.7])[0] == "not run"
    assert verdict([0.5], [math.nan])[0] == "not run"
