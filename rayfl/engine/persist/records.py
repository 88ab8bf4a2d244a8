"""What happened each round, and where it is written.

``RoundRecord`` is one row; ``RunWriter`` owns a run directory: the resolved config (``config.yaml``), one CSV row
appended and flushed per round (so an interrupted run keeps every finished round), ``rounds.parquet`` rewritten as
rounds finish, and the Parquet files and ``summary.json`` once more when the run ends, however it ends (finished,
stopped by a signal or by an error). ``evals.csv`` holds the further structures an algorithm has evaluated per round
(``EvalRecord``: one row per round and name). A resumed run reopens its directory with ``RunWriter.reopen``, cutting
the CSV files back to the lengths its checkpoint recorded. ``client_accs.csv`` (data with per-client test
sets) holds each client's accuracy per evaluated round (``ClientAccRecord``).
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any, TextIO, cast

import pyarrow as pa
import pyarrow.parquet as pq

from rayfl.core.files import is_storage_uri
from rayfl.engine.persist.storage import RunMirror, staged_run_dir
from rayfl.engine.persist.write_errors import RunWriteError, writing

__all__ = [
    "HOST_CLOCK_FIELDS",
    "ClientAccRecord",
    "ClientRecord",
    "EvalRecord",
    "RoundRecord",
    "RunWriter",
    "check_run_name",
    "make_run_dir",
    "read_round_records",
]

log = logging.getLogger(__name__)

# ``RoundRecord`` fields read off the host's clock: they differ between any two runs of one config (in-process or on
# Ray, resumed or not); every other field is a function of the config and seed.
HOST_CLOCK_FIELDS = frozenset(
    {"wall_time_s", "round_wall_s", "train_wall_s", "eval_wall_s", "search_s", "server_train_s", "checkpoint_s"}
)


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
    # mean over the clients that ran (finite budgets only) of the model's own need / the budget left after the runtime
    # overhead (system/clock.py: ClientPlan.memory_util)
    memory_util: float = math.nan
    bandwidth_util: float = math.nan
    failed_memory: int = 0  # at check-in: the model does not fit the memory budget
    failed_bandwidth: int = 0
    failed_memory_dip: int = 0  # memory fell below the need while training
    failed_other: int = 0  # dropped out, past the deadline, a lost link, a non-finite update
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
    # ``eval_all_devices``: the all-device model (the reducer over every client's last upload, paper 001's reporting
    # model): its main evaluation's accuracy and loss, and the device average on it; NaN otherwise
    all_devices_acc: float = math.nan
    all_devices_loss: float = math.nan
    all_devices_device_acc: float = math.nan
    # 1 when the round's aggregate or server step was not finite and the global model was rolled back to the state
    # before it (engine/guard.py); the round's simulated time and client failures stand
    rolled_back: int = 0
    # the checkpoint written after this round (engine/persist/checkpoint.py): bytes of its state file and wall seconds
    # spent gathering and writing it; its commit (the record files flushed to disk, the manifest) follows the record and
    # is not in it (``RunResult.checkpoint_commit_s``); 0 and NaN in rounds without one
    checkpoint_bytes: int = 0
    checkpoint_s: float = math.nan
    # Ray actors (client hosts, parameter-server shards) that died during the round and whose work was re-run
    faults: int = 0
    # multiply-accumulates of the round's local training over the clients that ran (3 x forward MACs x samples
    # processed, paper 002's training cost)
    train_macs: float = 0.0
    # clients offline at check-in: no network (a zero download or upload rate: a zero-bandwidth span of a trace) or
    # not available (``system.availability``); before issue 31 both were counted in ``failed_other``
    failed_no_network: int = 0
    failed_unavailable: int = 0
    # the round policy (engine/policies/): the staleness (server steps since its start version) of the updates the
    # round applied, mean and max (0 in sync rounds, NaN when none was applied), and the clients still in flight
    # after it (asynchronous policies; 0 in sync rounds)
    staleness_mean: float = math.nan
    staleness_max: float = math.nan
    in_flight: int = 0
    # mean over the clients that ran of the runtime overhead's share of the memory budget (system.memory_overhead_mib;
    # 0 without one, NaN for unlimited budgets): memory need / budget = share + memory_util x (1 - share)
    memory_overhead_share: float = math.nan


@dataclass(frozen=True)
class ClientRecord:
    """One sampled client in one round: budgets, needs, utilisation, planned times and why it failed (if it did)."""

    round_idx: int
    client_id: int
    memory_budget_mib: float
    memory_need_mib: float
    memory_util: float  # the model's own need / the budget left after the runtime overhead
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
    # the round policy: the global model version (server steps) it started on, its staleness when its round applied
    # it, its start in simulated time, and its share of the round's aggregate (asynchronous policies: its weight x
    # staleness weight over the weights; NaN in sync rounds and for clients not applied)
    start_version: int = 0
    staleness: float = 0.0
    start_s: float = 0.0
    agg_weight: float = math.nan


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
    from rayfl.core.errors import ConfigError
    from rayfl.experiment.loader import run_name_problem

    problem = run_name_problem(name)
    if problem:
        raise ConfigError(problem, "name")
    return name


def make_run_dir(output_dir: str | Path, name: str) -> Path:
    """A fresh directory ``output_dir/name`` (``name-1``, ``name-2`` ... when taken); never reuses one. A directory
    that cannot be made is a ``ConfigError`` on ``output_dir`` (the checks above cannot foresee every file system's
    refusal: a read-only mount, ``/proc``). On a storage URI (``s3://``, ``gs://``) the directory is a local staging
    folder that copies itself there (``storage.py``)."""
    from rayfl.core.errors import ConfigError
    from rayfl.experiment.loader import check_output_dir

    check_run_name(name)
    if is_storage_uri(output_dir):
        return staged_run_dir(str(output_dir), name)
    check_output_dir(output_dir)
    root = Path(output_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        for k in range(10_000):
            candidate = root / (name if k == 0 else f"{name}-{k}")
            try:
                candidate.mkdir()
                return candidate
            except FileExistsError:
                continue
    except OSError as err:
        raise ConfigError(
            f"cannot make a run directory in {str(root)!r} ({err.strerror or err}): give a directory you can write",
            "output_dir",
        ) from err
    raise ConfigError(f"no free run directory under {str(root)!r} ({name}-1 to {name}-9999 are taken)", "output_dir")


class _CsvTable:
    """One record file: ``<name>.csv`` appended and flushed row by row, the rows kept for ``<name>.parquet``."""

    def __init__(
        self,
        run_dir: Path,
        name: str,
        cls: type,
        schema: pa.Schema,
        rows: list[Any] | None = None,
        columns: list[str] | None = None,
    ) -> None:
        self.name, self.cls, self.schema = name, cls, schema
        self.optional = name in _OPTIONAL_PARQUET
        self.path = run_dir / f"{name}.csv"
        self.rows: list[Any] = [] if rows is None else rows
        # the CSV's columns: every field of the record, or (a run resumed from an earlier rayfl) the columns its file
        # has, so that its checkpoints' byte sizes stay true; the Parquet twin always holds every field
        self.columns = columns if columns is not None else [f.name for f in fields(cls)]
        self.file, self.writer = self._open("w" if rows is None else "a")
        if rows is None:
            with writing(self.path):
                self.writer.writeheader()
                self.file.flush()

    def _open(self, mode: str) -> tuple[TextIO, csv.DictWriter[str]]:
        with writing(self.path):
            file = cast(TextIO, self.path.open(mode, newline=""))
        return file, csv.DictWriter(file, fieldnames=self.columns, extrasaction="ignore")

    @classmethod
    def reopen(cls, run_dir: Path, name: str, record: type, schema: pa.Schema, size: int) -> _CsvTable:
        """The table of an existing run cut back to its first ``size`` bytes (a checkpoint's length), its rows read
        back from that part exactly as they were written (floats round-trip through ``repr``)."""
        path = run_dir / f"{name}.csv"
        have = path.stat().st_size
        if have < size:
            raise ValueError(f"{path}: holds {have} bytes, fewer than the {size} the checkpoint recorded")
        with path.open("r+b") as raw:
            raw.truncate(size)
        rows, columns = _read_rows(path, record)
        return cls(run_dir, name, record, schema, rows, columns)

    def append(self, records: Sequence[Any]) -> None:
        self.rows.extend(records)
        with writing(self.path):
            self.writer.writerows(asdict(r) for r in records)
            self.file.flush()

    def size(self, sync: bool = False) -> int:
        """Bytes written so far (``sync``: forced to disk first, as a checkpoint that refers to them needs)."""
        with writing(self.path):
            self.file.flush()
            if sync:
                os.fsync(self.file.fileno())
            return os.fstat(self.file.fileno()).st_size

    def cut_back(self, num_rows: int, size: int) -> None:
        """Back to its first ``num_rows`` rows and ``size`` bytes, after an append that failed part-way: what the
        file object still buffers is dropped with it (closing it may fail to write that too), the file cut."""
        with contextlib.suppress(OSError):
            self.file.close()
        del self.rows[num_rows:]
        with writing(self.path):
            os.truncate(self.path, size)
        self.file, self.writer = self._open("a")

    def write_parquet(self, run_dir: Path) -> None:
        if self.optional and not self.rows:  # client_accs: only runs with per-client test data have rows
            return
        table = pa.Table.from_pylist([asdict(r) for r in self.rows], schema=self.schema)
        path = run_dir / f"{self.name}.parquet"
        tmp = run_dir / f"{self.name}.parquet.tmp"
        try:
            with writing(path):
                pq.write_table(table, tmp)
                os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def close(self) -> None:
        if not self.file.closed:
            with writing(self.path):
                self.file.close()


_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "str": str}


def _read_rows(path: Path, record: type) -> tuple[list[Any], list[str]]:
    """The rows of a record file as ``record``s, exactly as they were written (floats round-trip through ``repr``),
    and the file's columns."""
    kinds = {f.name: _PARSERS.get(str(f.type), float) for f in fields(record)}
    with path.open(newline="") as text:
        reader = csv.DictReader(text)
        columns = list(reader.fieldnames or [])
        # a run written by an earlier rayfl has fewer columns, in the same order: later fields take their
        # defaults in the rows read back, and the file keeps its own columns (its checkpoints measure it)
        if [k for k in kinds if k in columns] != columns or not columns:
            raise ValueError(f"{path}: its columns are not the ones this version of rayfl writes")
        return [record(**{k: kinds[k](v) for k, v in row.items()}) for row in reader], columns


def read_round_records(run_dir: Path) -> list[RoundRecord]:
    """The rows of ``run_dir/rounds.csv`` as written so far (a run in progress flushes every row)."""
    return _read_rows(run_dir / "rounds.csv", RoundRecord)[0]


_TABLES: tuple[tuple[str, type, pa.Schema], ...] = (
    ("rounds", RoundRecord, _SCHEMA),
    ("clients", ClientRecord, _CLIENT_SCHEMA),
    ("evals", EvalRecord, _EVAL_SCHEMA),
    ("client_accs", ClientAccRecord, _CLIENT_ACC_SCHEMA),
)
_OPTIONAL_PARQUET = frozenset({"client_accs"})  # its Parquet file only when it has rows


class RunWriter:
    """Writes a run directory as the run goes; ``reopen`` continues one from a checkpoint's record lengths."""

    def __init__(
        self, run_dir: Path, resolved_config: Mapping[str, Any] | None, *, sizes: Mapping[str, int] | None = None
    ):
        self.run_dir = run_dir
        # a run on a storage URI: the run directory is a staging folder copied there by ``push``
        self.mirror = RunMirror.of(run_dir)
        if sizes is None:
            if resolved_config is not None:
                _atomic_write(run_dir / "config.yaml", _yaml(resolved_config))
            self._tables = {name: _CsvTable(run_dir, name, cls, schema) for name, cls, schema in _TABLES}
        else:
            self._tables = {
                name: _CsvTable.reopen(run_dir, name, cls, schema, int(sizes[name])) for name, cls, schema in _TABLES
            }

    @classmethod
    def reopen(cls, run_dir: Path, sizes: Mapping[str, int]) -> RunWriter:
        """The writer of an existing run directory whose record files are cut back to ``sizes`` (``sizes()`` at a
        checkpoint): what later rounds appended is dropped, since the resumed run writes those rounds again."""
        return cls(run_dir, None, sizes=sizes)

    @property
    def rows(self) -> list[RoundRecord]:
        return self._tables["rounds"].rows

    @property
    def client_rows(self) -> list[ClientRecord]:
        return self._tables["clients"].rows

    @property
    def eval_rows(self) -> list[EvalRecord]:
        return self._tables["evals"].rows

    @property
    def client_acc_rows(self) -> list[ClientAccRecord]:
        return self._tables["client_accs"].rows

    def append_client_accs(self, records: list[ClientAccRecord]) -> None:
        self._tables["client_accs"].append(records)

    def append_evals(self, records: list[EvalRecord]) -> None:
        self._tables["evals"].append(records)

    def append_clients(self, records: list[ClientRecord]) -> None:
        self._tables["clients"].append(records)

    def append(self, record: RoundRecord, parquet_every: int = 10) -> None:
        self._tables["rounds"].append([record])
        if len(self.rows) % parquet_every == 0:
            self.write_parquet()

    @contextlib.contextmanager
    def round_rows(self) -> Iterator[None]:
        """The appends of one round, all or none: when one fails (a full disk), every record file is cut back to
        where it was before the round, so the rounds the files hold are whole in every one of them."""
        marks = {name: (len(table.rows), table.size()) for name, table in self._tables.items()}
        try:
            yield
        except RunWriteError:
            for name, (num_rows, size) in marks.items():
                self._tables[name].cut_back(num_rows, size)
            raise

    def push(self) -> None:
        """Copy what changed in the run directory to its storage (a run on a storage URI; nothing for a local run)."""
        if self.mirror is not None:
            self.mirror.push()

    def sizes(self, sync: bool = False) -> dict[str, int]:
        """Bytes of every record file so far, by table name (what a checkpoint records and ``reopen`` cuts back to)."""
        return {name: table.size(sync) for name, table in self._tables.items()}

    def write_parquet(self) -> None:
        for table in self._tables.values():
            table.write_parquet(self.run_dir)

    def finish(self, summary: Mapping[str, Any], failing: bool = False) -> None:
        """Parquet files and ``summary.json`` from the rows written so far: called however the run ends (finished,
        stopped by a signal or an error), so the CSV, Parquet and summary files always hold the same rounds.

        ``failing``: the run is ending on an error already, which is the one to report. A file that cannot be
        written now either (the same full disk) is then left as it was, logged, and the next one tried."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
        steps: list[Callable[[], None]] = [
            *(partial(table.write_parquet, self.run_dir) for table in self._tables.values()),
            self.close,
            partial(_atomic_write, self.run_dir / "summary.json", json.dumps(clean, indent=2) + "\n"),
        ]
        for step in steps:
            try:
                step()
            except RunWriteError as err:
                if not failing:
                    self.close_quietly()
                    raise
                log.info("while ending on an error: %s", err)

    def close_quietly(self) -> None:
        """Close every record file, ignoring what cannot be written any more (a run ending on a write error)."""
        for table in self._tables.values():
            with contextlib.suppress(OSError):
                table.close()

    def close(self) -> None:
        for table in self._tables.values():
            table.close()


def _yaml(data: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(dict(data), sort_keys=False)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with writing(path):
            tmp.write_text(text)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
