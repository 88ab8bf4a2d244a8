"""Every method's algorithm class is at most two levels below ``Algorithm`` (issue 43, item 5): a method is one
subclass of ``Algorithm`` or of ``SubModelAlgorithm``, and what methods share beyond that is held, not inherited
(``rates.UniformRates``, ``nested.NestedWidths``); a paper's ablations and baselines that differ only in their config
are their method's class run with their section (``fedseq``, ``fedrush``, ``noside``, ``decouple``)."""

from __future__ import annotations

import pytest

from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.registry import METHODS, algorithm_class, build_algorithm
from tests.helpers import tiny_config

MAX_DEPTH = 2


def depth_below_algorithm(cls: type) -> int:
    """The longest chain of bases from ``cls`` up to ``Algorithm`` (0 for ``Algorithm`` itself); bases that are no
    ``Algorithm`` (mixins) do not count."""
    return max((1 + depth_below_algorithm(b) for b in cls.__bases__ if issubclass(b, Algorithm)), default=0)


def test_depth_counts_the_longest_chain() -> None:
    class One(Algorithm):
        pass

    class Two(One):
        pass

    class Three(Two, One):
        pass

    assert [depth_below_algorithm(c) for c in (Algorithm, One, Two, Three)] == [0, 1, 2, 3]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_is_at_most_two_levels_below_algorithm(name: str) -> None:
    cls = algorithm_class(name)
    assert depth_below_algorithm(cls) <= MAX_DEPTH, [c.__name__ for c in cls.__mro__ if issubclass(c, Algorithm)]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_runs_under_its_own_name(name: str) -> None:
    """A class that serves several names takes its instance's from the config: errors and records name the method
    the config asked for."""
    algorithm = build_algorithm(METHODS[name].config(), tiny_config().train)
    assert algorithm.name == name
