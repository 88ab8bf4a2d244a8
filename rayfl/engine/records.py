"""What happened each round, and where it is written.

``RoundRecord`` is one row; ``RunWriter`` owns a run directory: the resolved config (``config.yaml``), one CSV row
appended and flushed per round (so an interrupted run keeps every finished round), ``rounds.parquet`` rewritten as
rounds finish, and ``summary.json`` at the end.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["RoundRecord", "RunWriter", "make_run_dir"]


@dataclass(frozen=True)
class RoundRecord:
    """One round. Times ending in ``_s`` are seconds; ``sim_`` is simulated time, ``wall_`` is host time."""

    round_idx: int
    sim_time_s: float
    train_loss: float
    test_acc: float
    test_loss: float
    clients_run: int
    clients_failed: int
    bytes_down: int
    bytes_up: int
    wall_time_s: float
    round_wall_s: float
    train_wall_s: float
    eval_wall_s: float
    lr: float


_SCHEMA = pa.schema([(f.name, pa.int64() if f.type in ("int", int) else pa.float64()) for f in fields(RoundRecord)])


def make_run_dir(output_dir: str | Path, name: str) -> Path:
    """A fresh directory ``output_dir/name`` (``name-1``, ``name-2`` ... when taken); never reuses one."""
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    for k in range(10_000):
        candidate = root / (name if k == 0 else f"{name}-{k}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"no free run directory under {root}")


class RunWriter:
    """Writes a run directory as the run goes."""

    def __init__(self, run_dir: Path, resolved_config: Mapping[str, Any]) -> None:
        self.run_dir = run_dir
        self.rows: list[RoundRecord] = []
        _atomic_write(run_dir / "config.yaml", _yaml(resolved_config))
        self._csv: TextIO = (run_dir / "rounds.csv").open("w", newline="")
        self._writer = csv.DictWriter(self._csv, fieldnames=[f.name for f in fields(RoundRecord)])
        self._writer.writeheader()

    def append(self, record: RoundRecord, parquet_every: int = 10) -> None:
        self.rows.append(record)
        self._writer.writerow(asdict(record))
        self._csv.flush()
        if len(self.rows) % parquet_every == 0:
            self.write_parquet()

    def write_parquet(self) -> None:
        table = pa.Table.from_pylist([asdict(r) for r in self.rows], schema=_SCHEMA)
        tmp = self.run_dir / "rounds.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.run_dir / "rounds.parquet")

    def finish(self, summary: Mapping[str, Any]) -> None:
        self.write_parquet()
        self._csv.close()
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
        _atomic_write(self.run_dir / "summary.json", json.dumps(clean, indent=2) + "\n")

    def close(self) -> None:
        if not self._csv.closed:
            self._csv.close()


def _yaml(data: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(dict(data), sort_keys=False)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
