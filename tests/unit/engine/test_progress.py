"""The progress line says what happened in a round: failed clients counted by reason, and in asynchronous runs each
server step's applied and failed updates, their staleness and the clients still in flight (issue 44, item 5), read
against the run's own ``rounds.csv``."""

from __future__ import annotations

import dataclasses
import io
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.config.sections import ResourceConfig, ServerConfig, SystemConfig
from rayfl.core.messages import Assignment
from rayfl.engine.build import build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.persist.records import RoundRecord
from rayfl.engine.progress import ProgressLine, failure_summary
from tests.helpers import tiny_config, tiny_image_dataset

SYNC = re.compile(r"^round +(\d+)/\d+ \| .* \| clients (\d+)/(\d+) ok(?: \(([^)]*)\))? \| sim ")
ASYNC = re.compile(
    r"^step +(\d+)/\d+ \| .* \| updates (\d+) applied(?:, (\d+) failed \(([^)]*)\))? \| "
    r"(?:staleness ([\d.]+) mean, (\d+) max|no staleness) \| (\d+) in flight \| sim .* s/step \| ETA"
)
REASONS = {
    "unavailable": "failed_unavailable",
    "no network": "failed_no_network",
    "memory": "failed_memory",
    "bandwidth": "failed_bandwidth",
    "memory dip": "failed_memory_dip",
    "other": "failed_other",
}


def _reasons(text: str | None) -> dict[str, int]:
    """``"3 memory, 1 bandwidth"`` as the ``rounds.csv`` counters it names."""
    if not text:
        return {}
    return {REASONS[label]: int(n) for n, label in (part.split(" ", 1) for part in text.split(", "))}


def _record(**fields: float) -> RoundRecord:
    zeros = dict.fromkeys(("sim_time_s", "train_loss", "test_acc", "test_loss", "wall_time_s", "lr"), 0.0)
    zeros.update(dict.fromkeys(("round_wall_s", "train_wall_s", "eval_wall_s"), 0.0))
    sizes = dict.fromkeys(("clients_run", "clients_failed", "bytes_down", "bytes_up"), 0)
    return RoundRecord(round_idx=0, **{**zeros, **sizes, **fields})  # type: ignore[arg-type]


def test_failures_are_counted_by_reason_and_what_no_counter_names_is_other() -> None:
    record = _record(clients_sampled=10, clients_failed=5, failed_memory=2, failed_bandwidth=1, failed_other=1)
    assert failure_summary(record) == "2 memory, 1 bandwidth, 2 other"  # one failed client no counter names
    assert failure_summary(_record(clients_sampled=4)) == ""
    stream = io.StringIO()
    ProgressLine(stream, total_rounds=3)(record)
    assert " | clients 5/10 ok (2 memory, 1 bandwidth, 2 other) | " in stream.getvalue()


def _memory_config(tmp_path: Path, server: ServerConfig):  # type: ignore[no-untyped-def]
    """A tiny run whose memory budgets are drawn per client and round around the model's need, so some clients
    fail ``memory`` at check-in; slow enough compute that clients overlap in flight."""
    data = tiny_image_dataset()
    base = dataclasses.replace(tiny_config(kind="local"), rounds=6, output_dir=str(tmp_path), server=server)
    need = float(build_clock(base, build_setup(base, data)).oracle.costs([Assignment()]).memory[0]) / 2.0**20
    system = SystemConfig(
        memory=ResourceConfig(source="uniform", low=0.2 * need, high=1.6 * need),  # about 4 in 10 fit
        compute=ResourceConfig(source="uniform", low=0.02, high=0.2, per_round=False),
    )
    return dataclasses.replace(base, system=system), data


def _run_lines(cfg, data, asynchronous: bool) -> tuple[list[str], pd.DataFrame]:  # type: ignore[no-untyped-def]
    stream = io.StringIO()
    result = run_experiment(cfg, dataset=data, callbacks=[ProgressLine(stream, cfg.rounds, asynchronous)])
    assert result.run_dir is not None
    return stream.getvalue().splitlines(), pd.read_csv(result.run_dir / "rounds.csv")


def test_a_sync_round_line_counts_its_failed_clients_as_rounds_csv_does(tmp_path: Path) -> None:
    cfg, data = _memory_config(tmp_path, ServerConfig())
    lines, rounds = _run_lines(cfg, data, asynchronous=False)
    assert len(lines) == len(rounds) == cfg.rounds
    failed_somewhere = False
    for line, (_, row) in zip(lines, rounds.iterrows(), strict=True):
        m = SYNC.match(line)
        assert m, line
        assert int(m[2]) == row.clients_sampled - row.clients_failed and int(m[3]) == row.clients_sampled, line
        counts = _reasons(m[4])
        assert sum(counts.values()) == row.clients_failed, (line, row.to_dict())
        for key, n in counts.items():
            assert n == row[key], (line, key, row[key])
        failed_somewhere |= row.clients_failed > 0
    assert failed_somewhere, rounds[["clients_sampled", "clients_failed", "failed_memory"]]


def test_an_asynchronous_step_line_gives_applied_and_failed_updates_staleness_and_clients_in_flight(
    tmp_path: Path,
) -> None:
    """FedBuff with C = 5 in flight and B = 2: each step's line reads ``updates A applied, F failed (reasons) |
    staleness m mean, M max | N in flight`` with the numbers ``rounds.csv`` records for that step."""
    cfg, data = _memory_config(tmp_path, ServerConfig(policy="fedbuff", concurrency=5, buffer_size=2))
    lines, rounds = _run_lines(cfg, data, asynchronous=True)
    assert len(lines) == len(rounds) == cfg.rounds
    failed_somewhere = stale_somewhere = False
    for line, (_, row) in zip(lines, rounds.iterrows(), strict=True):
        m = ASYNC.match(line)
        assert m, line
        assert int(m[2]) == row.clients_sampled - row.clients_failed, (line, row.to_dict())
        assert int(m[3] or 0) == row.clients_failed, (line, row.to_dict())
        counts = _reasons(m[4])
        assert sum(counts.values()) == row.clients_failed and all(row[k] == n for k, n in counts.items()), line
        if math.isnan(row.staleness_mean):
            assert "no staleness" in line, line
        else:
            assert np.isclose(float(m[5]), row.staleness_mean, atol=0.05) and int(m[6]) == row.staleness_max, line
        assert int(m[7]) == row.in_flight, (line, row.in_flight)
        failed_somewhere |= row.clients_failed > 0
        stale_somewhere |= row.staleness_max > 0
    assert failed_somewhere and stale_somewhere, rounds[["clients_failed", "staleness_max", "in_flight"]]
