"""ASHA fed only measured values: a trial's accuracy is carried between evaluations (``metrics.py``), NaN before the
first one, so a rung crossed on a round that did not evaluate would record a stale value or NaN (and a NaN ranks
below everything, stopping the trial). ``EvaluatedASHA`` skips such results: the trial is placed on a rung at the
first round at or after the rung's time that measured the metric afresh (``evaluated`` for ``test_acc`` and
``test_loss``, ``client_evaluated`` for ``client_acc``; every other reported metric is measured each round but may
still be NaN, which is skipped as well). Imports Ray: ``sweep.py`` imports it when a sweep has a scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

__all__ = ["EvaluatedASHA", "measured"]

_FRESH_FLAG = {"test_acc": "evaluated", "test_loss": "evaluated", "client_acc": "client_evaluated"}


def measured(result: Mapping[str, Any], metric: str) -> bool:
    """Whether ``result`` holds a value of ``metric`` measured in its own round (finite, and fresh when carried)."""
    value = result.get(metric)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return False
    flag = _FRESH_FLAG.get(metric)
    return flag is None or bool(result.get(flag, False))


class EvaluatedASHA(ASHAScheduler):  # type: ignore[misc]  # Ray is not type-checked (pyproject: follow_imports skip)
    """``ASHAScheduler`` that sees only results whose metric was measured in their round (module docstring)."""

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if not measured(result, self._metric):
            return str(TrialScheduler.CONTINUE)
        return str(super().on_trial_result(tune_controller, trial, result))

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        if measured(result, self._metric):
            super().on_trial_complete(tune_controller, trial, result)
        else:  # nothing measured to record at a rung: forget the trial as ASHA would after recording
            self._trial_info.pop(trial.trial_id, None)
