"""What happened each round, and where it is written.

``RoundRecord`` is one row; ``RunWriter`` owns a run directory: the resolved config (``config.yaml``), one CSV row
appended and flushed per round (so an interrupted run keeps every finished round), ``rounds.parquet`` rewritten as
rounds finish, and ``summary.json`` at the end. ``evals.csv`` holds the further structures an algorithm has
evaluated per round (``EvalRecord``: one row per round and name); ``client_accs.csv`` (data with per-client test
sets) each client's accuracy per evaluated round (``ClientAccRecord``).
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

__all__ = [
    "ClientAccRecord",
    "ClientRecord",
    "EvalRecord",
    "RoundRecord",
    "RunWriter",
    "check_run_name",
    "make_run_dir",
]


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
    sim_duration_s: float = 0.0
    clients_sampled: int = 0
    memory_util: float = math.nan  # mean need / budget over the clients that ran (finite budgets only)
    bandwidth_util: float = math.nan
    failed_memory: int = 0  # at check-in: the model does not fit the memory budget
    failed_bandwidth: int = 0
    failed_memory_dip: int = 0  # memory fell below the need while training
    failed_other: int = 0  # unavailable, dropped out, past the deadline, or a non-finite update
    over_budget: int = 0  # clients that trained although their model exceeded a budget (budgets ignored)
    search_s: float = math.nan  # the algorithm's own numbers (``Algorithm.round_stats``); NaN where it has none
    distinct_structures: float = math.nan
    hit_rate: float = math.nan
    server_train_s: float = math.nan
    phase: str = ""  # the phase's name in a multi-phase run (engine/phases.py)
    # several global models (``ServerState.models``): each model's test accuracy and how many clients trained each
    # (space separated, by model id; "" in a single-model run), and the mean over clients of each client's test
    # accuracy on the model it would be assigned (NaN without per-client test data)
    num_models: int = 1
    model_accs: str = ""
    clients_per_model: str = ""
    client_acc: float = math.nan
    # the mean over all devices of the accuracy of the model each uses (``Algorithm.device_evals``: FedHeN's simple
    # devices on the simple model, complex devices on the complex one); NaN in a round without evaluation
    device_acc: float = math.nan
    # multiply-accumulates of the round's local training over the clients that ran (3 x forward MACs x samples
    # processed, paper 002's training cost)
    train_macs: float = 0.0


@dataclass(frozen=True)
class ClientRecord:
    """One sampled client in one round: budgets, needs, utilisation, planned times and why it failed (if it did)."""

    round_idx: int
    client_id: int
    memory_budget_mib: float
    memory_need_mib: float
    memory_util: float
    bandwidth_budget_mb: float  # megabytes movable within the communication limit
    bandwidth_need_mb: float  # megabytes down + up
    bandwidth_util: float
    download_s: float
    compute_s: float
    upload_s: float
    failure: str  # "" when the client trained and was aggregated
    over_budget: str = ""  # the budget its model exceeded although it trained (budgets ignored), else ""
    units: str = ""  # the sub-model's units per search dimension, space separated ("" = the whole model)
    p_down: float = math.nan  # unstable links: width ratio of the model that arrived (NaN: perfect links, not run)
    p_up: float = math.nan  # and of the update that reached the server
    model_id: int = 0  # which global model it was assigned
    train_macs: float = 0.0  # multiply-accumulates of its round's local training (planned; 0 when it did not run)


@dataclass(frozen=True)
class ClientAccRecord:
    """One client's test accuracy in an evaluated round, on the model it would be assigned (data with per-client test
    sets only): the average client accuracy's parts, and paper 002's per-client box plot."""

    round_idx: int
    client_id: int
    model_id: int
    evaluation: str  # the evaluation that scored it (``Algorithm.device_evals``: main, a model's or a structure's name)
    test_acc: float
    num_test: int


@dataclass(frozen=True)
class EvalRecord:
    """One further evaluation in a round: a structure of ``Algorithm.eval_structures`` (FedHeN's simple model) or a
    global model after the first (``Algorithm.model_names``: Decouple's simple model)."""

    round_idx: int
    name: str
    test_acc: float
    test_loss: float


def _schema(cls: type) -> pa.Schema:
    kinds = {"int": pa.int64(), "str": pa.string()}
    return pa.schema([(f.name, kinds.get(str(f.type), pa.float64())) for f in fields(cls)])


_SCHEMA = _schema(RoundRecord)
_CLIENT_SCHEMA = _schema(ClientRecord)
_EVAL_SCHEMA = _schema(EvalRecord)
_CLIENT_ACC_SCHEMA = _schema(ClientAccRecord)


def check_run_name(name: str) -> str:
    """``name`` when it is one plain directory name, else a ``ConfigError`` (a ``ValueError``) on key ``name``: a run
    or sweep directory never lands outside ``output_dir``."""
    from rayfl.config_loader import ConfigError, run_name_problem

    problem = run_name_problem(name)
    if problem:
        raise ConfigError(problem, "name")
    return name


def make_run_dir(output_dir: str | Path, name: str) -> Path:
    """A fresh directory ``output_dir/name`` (``name-1``, ``name-2`` ... when taken); never reuses one."""
    check_run_name(name)
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
        self.client_rows: list[ClientRecord] = []
        self._clients_csv: TextIO = (run_dir / "clients.csv").open("w", newline="")
        self._clients_writer = csv.DictWriter(self._clients_csv, fieldnames=[f.name for f in fields(ClientRecord)])
        self._clients_writer.writeheader()
        self.eval_rows: list[EvalRecord] = []
        self._evals_csv: TextIO = (run_dir / "evals.csv").open("w", newline="")
        self._evals_writer = csv.DictWriter(self._evals_csv, fieldnames=[f.name for f in fields(EvalRecord)])
        self._evals_writer.writeheader()
        self.client_acc_rows: list[ClientAccRecord] = []
        self._client_accs_csv: TextIO | None = None  # opened with the first rows (per-client test data only)

    def append_client_accs(self, records: list[ClientAccRecord]) -> None:
        if not records:
            return
        if self._client_accs_csv is None:
            self._client_accs_csv = (self.run_dir / "client_accs.csv").open("w", newline="")
            names = [f.name for f in fields(ClientAccRecord)]
            self._client_accs_writer = csv.DictWriter(self._client_accs_csv, fieldnames=names)
            self._client_accs_writer.writeheader()
        self.client_acc_rows.extend(records)
        self._client_accs_writer.writerows(asdict(r) for r in records)
        self._client_accs_csv.flush()

    def append_evals(self, records: list[EvalRecord]) -> None:
        self.eval_rows.extend(records)
        self._evals_writer.writerows(asdict(r) for r in records)
        self._evals_csv.flush()

    def append_clients(self, records: list[ClientRecord]) -> None:
        self.client_rows.extend(records)
        self._clients_writer.writerows(asdict(r) for r in records)
        self._clients_csv.flush()

    def append(self, record: RoundRecord, parquet_every: int = 10) -> None:
        self.rows.append(record)
        self._writer.writerow(asdict(record))
        self._csv.flush()
        if len(self.rows) % parquet_every == 0:
            self.write_parquet()

    def write_parquet(self) -> None:
        for name, rows, schema in (
            ("rounds", self.rows, _SCHEMA),
            ("clients", self.client_rows, _CLIENT_SCHEMA),
            ("evals", self.eval_rows, _EVAL_SCHEMA),
            ("client_accs", self.client_acc_rows, _CLIENT_ACC_SCHEMA),
        ):
            if name == "client_accs" and not rows:
                continue
            table = pa.Table.from_pylist([asdict(r) for r in rows], schema=schema)
            tmp = self.run_dir / f"{name}.parquet.tmp"
            pq.write_table(table, tmp)
            os.replace(tmp, self.run_dir / f"{name}.parquet")

    def finish(self, summary: Mapping[str, Any]) -> None:
        self.write_parquet()
        self.close()
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
        _atomic_write(self.run_dir / "summary.json", json.dumps(clean, indent=2) + "\n")

    def close(self) -> None:
        for f in (self._csv, self._clients_csv, self._evals_csv, self._client_accs_csv):
            if f is not None and not f.closed:
                f.close()


def _yaml(data: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(dict(data), sort_keys=False)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
