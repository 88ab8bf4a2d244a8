"""A one-line-per-round progress display with an ETA, written to a stream the caller chooses."""

from __future__ import annotations

import math
from typing import TextIO

from rayfl.core.units import format_sim_time
from rayfl.engine.persist.records import RoundRecord

__all__ = ["ProgressLine", "failure_summary"]


# why clients failed, as ``rounds.csv`` counts them, in the order the clock checks them
_REASONS = (
    ("failed_unavailable", "unavailable"),
    ("failed_no_network", "no network"),
    ("failed_memory", "memory"),
    ("failed_bandwidth", "bandwidth"),
    ("failed_memory_dip", "memory dip"),
    ("failed_other", "other"),
)


def failure_summary(record: RoundRecord) -> str:
    """The round's failed clients by reason, ``"2 memory, 1 bandwidth"`` (``failed_other``: dropped out, past the
    deadline, a lost link or a non-finite update; whatever no counter names is ``other`` too), ``""`` when none."""
    counts = [(getattr(record, key), label) for key, label in _REASONS]
    unnamed = record.clients_failed - sum(n for n, _ in counts)
    counts = [(n + unnamed, label) if label == "other" else (n, label) for n, label in counts]
    return ", ".join(f"{n} {label}" for n, label in counts if n > 0)


class ProgressLine:
    """Prints ``round    7/19 | train loss  2.410 | acc 31.20% | clients 8/10 ok (2 memory) | sim 21.74 s | 1.90
    s/round | ETA 0:25`` for each finished round, flagging a round in which every sampled client failed and a round
    rolled back because its server step was not finite. Rounds are numbered from 0 up to ``total - 1``, as in
    ``rounds.csv``, ``report.md`` and the plots; simulated time is in s, min or h (``rayfl/core/units.py``); failed
    clients are counted by reason (``failure_summary``).

    ``asynchronous`` (FedBuff, FedAsync: ``server.policy``): a "round" is one server step, and its clients are the
    updates that arrived for it, so the line says ``step`` and ``updates 4 applied, 9 failed (9 memory)``, the
    staleness of the applied ones (server steps since the version each started on, mean and max) and the clients
    still in flight: a step ends after ``buffer_size`` successful arrivals, or once as many arrivals as
    ``concurrency`` have failed, so it may apply fewer than B updates (``docs/round-policies.md``)."""

    def __init__(self, stream: TextIO, total_rounds: int, asynchronous: bool = False) -> None:
        self.stream = stream
        self.total = total_rounds
        self.asynchronous = asynchronous
        self._round_s = 0.0
        self._seen = 0  # rounds this process ran (a resumed run starts past round 0)

    def _clients(self, record: RoundRecord) -> str:
        ok = record.clients_sampled - record.clients_failed
        reasons = failure_summary(record)
        if not self.asynchronous:
            return f"clients {ok}/{record.clients_sampled} ok" + (f" ({reasons})" if reasons else "")
        failed = f", {record.clients_failed} failed" + (f" ({reasons})" if reasons else "")
        stale = (
            "no staleness"
            if math.isnan(record.staleness_mean)
            else f"staleness {record.staleness_mean:.1f} mean, {record.staleness_max:.0f} max"
        )
        return f"updates {ok} applied{failed if record.clients_failed else ''} | {stale} | {record.in_flight} in flight"

    def __call__(self, record: RoundRecord) -> None:
        done = record.round_idx + 1
        self._round_s += record.round_wall_s
        self._seen += 1
        per_round = self._round_s / self._seen  # start-up excluded, so the ETA is not inflated by it
        eta = int(per_round * (self.total - done))
        acc = "" if math.isnan(record.test_acc) else f" | acc {100 * record.test_acc:5.2f}%"
        word = "step" if self.asynchronous else "round"
        line = (
            f"{word} {record.round_idx:>4}/{self.total - 1} | train loss {record.train_loss:6.3f}{acc}"
            f" | {self._clients(record)}"
            f" | sim {format_sim_time(record.sim_time_s):>10} | {per_round:5.2f} s/{word}"
            f" | ETA {eta // 60}:{eta % 60:02d}"
        )
        if record.clients_sampled > 0 and record.clients_failed == record.clients_sampled:
            line += " | ALL CLIENTS FAILED: model unchanged"
        if record.rolled_back:
            line += f" | NOT FINITE: {word} rolled back"
        if record.faults:  # Ray actors that died this round and whose work was re-run (engine/ray/recovery.py)
            line += f" | {record.faults} dead actor{'s' if record.faults > 1 else ''} replaced"
        self.stream.write(line + "\n")
        self.stream.flush()
