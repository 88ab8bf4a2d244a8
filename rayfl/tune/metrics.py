"""The numbers a trial reports to Tune every round, and the columns of the sweep's results table.

Per round (``RoundMetrics``): the round, the simulated time (``sim_time_s``, the time axis schedulers such as ASHA use),
the test accuracy and loss carried forward from the last evaluated round (NaN before the first evaluation), the
training loss, clients run and failed, dead actors replaced and whether the round was rolled back, memory and
bandwidth utilisation and, for model search, the search's numbers.
Nothing here imports Ray; ``trainable.py`` hands these dicts to ``tune.report``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayfl.engine.records import RoundRecord

__all__ = ["REPORTED_METRICS", "TABLE_METRICS", "RoundMetrics"]

REPORTED_METRICS: tuple[str, ...] = (
    "round_idx",
    "rounds_done",
    "sim_time_s",
    "test_acc",
    "test_loss",
    "evaluated",
    "train_loss",
    "clients_sampled",
    "clients_run",
    "clients_failed",
    "faults",
    "rolled_back",
    "memory_util",
    "bandwidth_util",
    "search_s",
    "distinct_structures",
    "hit_rate",
)

# Per-trial figures of the results table that a sweep may rank trials by (``metric:``) or plot.
TABLE_METRICS: tuple[str, ...] = (
    "test_acc",  # at the last evaluated round
    "best_test_acc",
    "test_loss",  # at the last round that recorded one
    "sim_hours",
    "memory_util",  # means over the rounds
    "bandwidth_util",
    "clients_failed",  # summed over the rounds
    "failure_rate",  # clients failed / clients sampled
    "distinct_structures",  # at the end (model search: the search's count; else structures trained)
    "hit_rate",  # mean over the rounds
    "search_s",  # mean seconds per round
    "rounds_done",
    "wall_s",
)


class RoundMetrics:
    """Turns each ``RoundRecord`` into Tune's metrics dict, carrying accuracy and loss between evaluations."""

    def __init__(self) -> None:
        self._acc = math.nan
        self._loss = math.nan

    @property
    def carried(self) -> tuple[float, float]:
        """The accuracy and loss carried forward (a checkpoint keeps them for a resumed trial)."""
        return self._acc, self._loss

    def carry(self, acc: float, loss: float) -> None:
        self._acc, self._loss = acc, loss

    def __call__(self, record: RoundRecord) -> dict[str, Any]:
        evaluated = math.isfinite(record.test_acc)
        if evaluated:
            self._acc, self._loss = record.test_acc, record.test_loss
        return {
            "round_idx": record.round_idx,
            "rounds_done": record.round_idx + 1,
            "sim_time_s": record.sim_time_s,
            "test_acc": self._acc,
            "test_loss": self._loss,
            "evaluated": evaluated,
            "train_loss": record.train_loss,
            "clients_sampled": record.clients_sampled,
            "clients_run": record.clients_run,
            "clients_failed": record.clients_failed,
            "faults": record.faults,  # Ray actors that died in the round and were replaced (engine/recovery.py)
            "rolled_back": record.rolled_back,  # the round's non-finite update was refused (engine/guard.py)
            "memory_util": record.memory_util,
            "bandwidth_util": record.bandwidth_util,
            "search_s": record.search_s,
            "distinct_structures": record.distinct_structures,
            "hit_rate": record.hit_rate,
        }
