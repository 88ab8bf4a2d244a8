"""A one-line-per-round progress display with an ETA, written to a stream the caller chooses."""

from __future__ import annotations

import math
from typing import TextIO

from rayfl.core.units import format_sim_time
from rayfl.engine.persist.records import RoundRecord

__all__ = ["ProgressLine"]


class ProgressLine:
    """Prints ``round    7/19 | train loss  2.410 | acc 31.20% | ... | sim 21.74 s | 1.90 s/round | ETA 0:25`` for
    each finished round, flagging a round in which every sampled client failed and a round rolled back because its
    server step was not finite. Rounds are numbered from 0 up to ``total - 1``, as in ``rounds.csv``, ``report.md``
    and the plots; simulated time is in s, min or h (``rayfl/core/units.py``)."""

    def __init__(self, stream: TextIO, total_rounds: int) -> None:
        self.stream = stream
        self.total = total_rounds
        self._round_s = 0.0
        self._seen = 0  # rounds this process ran (a resumed run starts past round 0)

    def __call__(self, record: RoundRecord) -> None:
        done = record.round_idx + 1
        self._round_s += record.round_wall_s
        self._seen += 1
        per_round = self._round_s / self._seen  # start-up excluded, so the ETA is not inflated by it
        eta = int(per_round * (self.total - done))
        acc = "" if math.isnan(record.test_acc) else f" | acc {100 * record.test_acc:5.2f}%"
        line = (
            f"round {record.round_idx:>4}/{self.total - 1} | train loss {record.train_loss:6.3f}{acc}"
            f" | clients {record.clients_sampled - record.clients_failed}/{record.clients_sampled} ok"
            f" | sim {format_sim_time(record.sim_time_s):>10} | {per_round:5.2f} s/round"
            f" | ETA {eta // 60}:{eta % 60:02d}"
        )
        if record.clients_sampled > 0 and record.clients_failed == record.clients_sampled:
            line += " | ALL CLIENTS FAILED: model unchanged"
        if record.rolled_back:
            line += " | NOT FINITE: round rolled back"
        if record.faults:  # Ray actors that died this round and whose work was re-run (engine/ray/recovery.py)
            line += f" | {record.faults} dead actor{'s' if record.faults > 1 else ''} replaced"
        self.stream.write(line + "\n")
        self.stream.flush()
