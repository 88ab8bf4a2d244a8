"""ASHA fed only measured values (``rayfl/tune/asha.py``): a rung is decided on the first round at or past it that
evaluated, never on a carried or NaN accuracy."""

from __future__ import annotations

import math

import pytest

from rayfl.tune.asha import measured


def test_carried_and_nan_values_are_not_measured() -> None:
    assert measured({"test_acc": 0.5, "evaluated": True}, "test_acc")
    assert not measured({"test_acc": 0.5, "evaluated": False}, "test_acc")  # carried from an earlier round
    assert not measured({"test_acc": math.nan, "evaluated": False}, "test_acc")
    assert not measured({"client_acc": 0.4, "evaluated": True, "client_evaluated": False}, "client_acc")
    assert measured({"memory_util": 0.3}, "memory_util") and not measured({"memory_util": math.nan}, "memory_util")


def test_a_rung_waits_for_the_first_evaluated_round() -> None:
    pytest.importorskip("ray.tune")
    from ray.tune.experiment import Trial

    from rayfl.tune.asha import EvaluatedASHA

    asha = EvaluatedASHA(time_attr="sim_time_s", metric="test_acc", mode="max", max_t=100, grace_period=10)
    good, late = Trial("__fake", stub=True), Trial("__fake", stub=True)
    for trial in (good, late):
        asha.on_trial_add(None, trial)
    assert asha.on_trial_result(None, good, {"sim_time_s": 12, "test_acc": 0.9, "evaluated": True}) == "CONTINUE"
    # crosses the first rung (10 s) on a round that did not evaluate: not recorded, not stopped for a NaN
    assert asha.on_trial_result(None, late, {"sim_time_s": 12, "test_acc": math.nan, "evaluated": False}) == "CONTINUE"
    rung = asha._brackets[0]._rungs[-1]
    assert rung[0] == 10 and late.trial_id not in rung[1]
    # its first evaluation is what the rung records (and, far below the other trial's, stops it)
    assert asha.on_trial_result(None, late, {"sim_time_s": 15, "test_acc": 0.1, "evaluated": True}) == "STOP"
    assert rung[1][late.trial_id] == 0.1
