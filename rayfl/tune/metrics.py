"""The numbers a trial reports to Tune every round, and the columns of the sweep's results table.

Per round (``RoundMetrics``): the round, the simulated time (``sim_time_s``, the time axis schedulers such as ASHA use),
the test accuracy and loss and the average client accuracy carried forward from the last evaluated round (NaN before
the first evaluation), the training loss, clients run and failed, dead actors replaced and whether the round was
rolled back, memory and bandwidth utilisation, for model search the search's numbers, and the training MACs so far
and the number of global models (paper 002's cost figures), and running figures over the rounds so far (best
accuracy, mean utilisations and hit rate, failed and sampled clients, network MB) from which the results table is
built when a trial's run directory cannot be read where the sweep runs. ``evaluated`` / ``client_evaluated`` say
whether the round measured the carried accuracies afresh (the ASHA scheduler is fed only such rounds).
Nothing here imports Ray; ``trainable.py`` hands these dicts to ``tune.report``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayfl.engine.persist.records import RoundRecord

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
    "client_acc",
    "train_gmacs",
    "num_models",
    "client_evaluated",
    # running figures over the rounds so far, so that the results table can be built from Tune's last report when a
    # trial's run directory cannot be read where the sweep runs (results.py)
    "best_test_acc",
    "mean_memory_util",
    "mean_bandwidth_util",
    "mean_hit_rate",
    "total_clients_failed",
    "total_clients_sampled",
    "total_network_mb",
)

# Per-trial figures of the results table that a sweep may rank trials by (``metric:``) or plot.
TABLE_METRICS: tuple[str, ...] = (
    "test_acc",  # at the last evaluated round
    "best_test_acc",
    "baseline_acc",  # the most-frequent-label accuracy of the trial's data (a result at or below it learned nothing)
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
    "client_acc",  # the average client accuracy at the last round that recorded one (paper 002)
    "train_gmacs",  # the clients' training multiply-accumulates over the run, in 10^9
    "network_mb",  # bytes down plus up over the run, in 10^6
    "models",  # global models at the end (FedTrans: the family it grew)
)


# running sums kept between rounds (a resumed trial rebuilds them with ``replay``)
_RUNNING = (
    "best_acc",
    "evaluations",
    "memory_util_sum",
    "memory_util_n",
    "bandwidth_util_sum",
    "bandwidth_util_n",
    "hit_rate_sum",
    "hit_rate_n",
    "clients_failed",
    "clients_sampled",
    "network_bytes",
)


class RoundMetrics:
    """Turns each ``RoundRecord`` into Tune's metrics dict, carrying accuracy and loss between evaluations."""

    def __init__(self) -> None:
        self._acc = math.nan
        self._loss = math.nan
        self._client_acc = math.nan
        self._macs = 0.0
        self._sums: dict[str, float] = dict.fromkeys(_RUNNING, 0.0)

    def replay(self, records: Iterable[RoundRecord]) -> None:
        """Take in the rounds a resumed trial ran before its checkpoint (its ``rounds.csv`` rows, read back exactly),
        so that the rounds after it report what an uninterrupted trial's would: the carried accuracies and the running
        figures are a function of the rounds so far, in order."""
        for record in records:
            self(record)

    def __call__(self, record: RoundRecord) -> dict[str, Any]:
        evaluated = math.isfinite(record.test_acc)
        if evaluated:
            self._acc, self._loss = record.test_acc, record.test_loss
        if math.isfinite(record.client_acc):
            self._client_acc = record.client_acc
        self._macs += record.train_macs
        self._accumulate(record)
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
            "faults": record.faults,  # Ray actors that died in the round and were replaced (engine/ray/recovery.py)
            "rolled_back": record.rolled_back,  # the round's non-finite update was refused (engine/guard.py)
            "memory_util": record.memory_util,
            "bandwidth_util": record.bandwidth_util,
            "search_s": record.search_s,
            "distinct_structures": record.distinct_structures,
            "hit_rate": record.hit_rate,
            "client_acc": self._client_acc,
            "train_gmacs": self._macs / 1e9,  # so far
            "num_models": record.num_models,
            "client_evaluated": math.isfinite(record.client_acc),
            **self._running(),
        }

    def _accumulate(self, record: RoundRecord) -> None:
        sums = self._sums
        if math.isfinite(record.test_acc):
            sums["best_acc"] = max(sums["best_acc"], record.test_acc) if sums["evaluations"] else record.test_acc
            sums["evaluations"] += 1
        for name in ("memory_util", "bandwidth_util", "hit_rate"):
            value = float(getattr(record, name))
            if math.isfinite(value):
                sums[f"{name}_sum"] += value
                sums[f"{name}_n"] += 1
        sums["clients_failed"] += record.clients_failed
        sums["clients_sampled"] += record.clients_sampled
        sums["network_bytes"] += record.bytes_down + record.bytes_up

    def _running(self) -> dict[str, float]:
        sums = self._sums

        def mean(name: str) -> float:
            n = sums[f"{name}_n"]
            return sums[f"{name}_sum"] / n if n else math.nan

        return {
            "best_test_acc": sums["best_acc"] if sums["evaluations"] else math.nan,
            "mean_memory_util": mean("memory_util"),
            "mean_bandwidth_util": mean("bandwidth_util"),
            "mean_hit_rate": mean("hit_rate"),
            "total_clients_failed": sums["clients_failed"],
            "total_clients_sampled": sums["clients_sampled"],
            "total_network_mb": sums["network_bytes"] / 1e6,
        }
