"""The Tune trainable: one trial is one simulation (or one search-only run), reporting every round.

Tune calls ``run_trial(config, plan=...)`` inside the trial's placement group (bundle 0); ``config`` holds the trial's
swept values under their dotted keys. The trial rebuilds its experiment config from the plan, names its run directory
after the Tune trial (``<sweep>/trials/<trial name>``, a normal run directory that ``rayfl report`` reads), runs, and
hands Tune one metrics dict per round (``metrics.RoundMetrics``). When a scheduler stops the trial early, the round
rows written so far stay in the run directory (``rounds.csv`` is flushed every round).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rayfl.tune.metrics import RoundMetrics

if TYPE_CHECKING:
    from rayfl.engine.records import RoundRecord
    from rayfl.tune.trials import TrialPlan

__all__ = ["TuneReporter", "run_trial"]

log = logging.getLogger(__name__)


class TuneReporter:
    """A round callback that reports each round's metrics to Tune."""

    def __init__(self, run_dir_hint: str) -> None:
        self._metrics = RoundMetrics()
        self._run_dir = run_dir_hint

    def __call__(self, record: RoundRecord) -> None:
        from ray import tune

        tune.report({**self._metrics(record), "run_dir": self._run_dir})


def run_trial(config: dict[str, Any], *, plan: TrialPlan) -> None:
    """Tune's function trainable for rayfl sweeps."""
    from ray import tune

    trial_name = tune.get_context().get_trial_name()
    point = {p.key: config[p.key] for p in plan.params}
    cfg = plan.config(point, name=trial_name)
    reporter = TuneReporter(str(plan.trials_dir / trial_name))
    log.info("trial %s: %s", trial_name, point)
    if plan.mode == "search_only":
        from rayfl.engine.search_only import run_search_only

        run_search_only(cfg, callbacks=[reporter])
    else:
        from rayfl.engine.driver import run_experiment

        run_experiment(cfg, callbacks=[reporter])
