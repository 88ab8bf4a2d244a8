"""Reading a finished (or interrupted) run directory back into memory.

A run directory is what the engine leaves behind: ``rounds.parquet`` (with ``rounds.csv`` as a readable twin),
``config.yaml`` with the resolved experiment config, and ``summary.json`` once the run has finished cleanly.
``load_run`` insists on the config and on one of the two round tables; ``summary.json`` is optional and, when
absent, is rebuilt from what the rounds table and the config say.

A damaged file (a Parquet file cut short, a CSV with binary bytes, a config that is not YAML) is reported in one line
naming it (``RunFileError``), and a reader falls back to its twin where that is whole: ``rounds.csv`` for a damaged
``rounds.parquet`` (with a warning), the derived summary for a damaged ``summary.json``.

The metric helpers below (``final_test_acc`` and friends) follow one rule: anything measured per round is
taken from the rounds table, and the summary is only consulted when the table lacks the column or has no
usable value.
Unknown columns are ignored and missing optional ones read as "not known" (``None``).
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

__all__ = [
    "CONFIG_FILE",
    "ROUNDS_CSV",
    "ROUNDS_PARQUET",
    "SUMMARY_FILE",
    "RunFileError",
    "RunRecords",
    "load_run",
    "unique_labels",
]

log = logging.getLogger(__name__)

ROUNDS_PARQUET = "rounds.parquet"
ROUNDS_CSV = "rounds.csv"
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"


class RunFileError(ValueError):
    """A file of a run directory that cannot be read (and has no whole twin): one line naming it."""


def _damaged(path: Path, err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{path} is damaged or not a rayfl record file ({text[:200]})"


def _read_csv(path: Path, **options: Any) -> pd.DataFrame:
    """A record CSV; ``RunFileError`` naming it when it does not parse."""
    try:
        return pd.read_csv(path, **options)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise RunFileError(_damaged(path, err)) from err


def _whole_rounds(path: Path, frame: pd.DataFrame) -> bool:
    """Rows of rounds 0, 1, ... in order and the file ending with its last row's line end (a CSV cut short by a full
    disk ends inside a row): what a readable ``rounds.csv`` holds."""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - 1))
        ends_a_row = f.read(1) in (b"", b"\n")
    if not ends_a_row or "round_idx" not in frame.columns or frame["round_idx"].isna().any():
        return False
    return list(frame["round_idx"]) == list(range(len(frame)))


def _finite(value: Any) -> float | None:
    """``value`` as a float, or None when it is missing, not numeric, NaN or infinite."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _section_name(config: dict[str, Any], key: str) -> str | None:
    """The ``name`` of a config section like ``algorithm: {name: fedavg}`` (a bare string is accepted too)."""
    section = config.get(key)
    if isinstance(section, dict):
        name = section.get("name")
        return None if name is None else str(name)
    if isinstance(section, str):
        return section
    return None


@dataclass(frozen=True)
class RunRecords:
    """Everything one run directory holds, loaded.

    Attributes:
        path: the run directory.
        name: the experiment name (summary, else config, else the directory name).
        algorithm: the algorithm name (summary, else ``config.algorithm.name``, else ``"unknown"``).
        config: the resolved experiment config as a plain mapping.
        rounds: one row per round, as written by the engine (columns beyond the known ones are kept as is).
        summary: ``summary.json``, or one derived from the rounds and the config when the file is absent.
        has_summary_file: whether ``summary.json`` existed (False for an interrupted run).
    """

    path: Path
    name: str
    algorithm: str
    config: dict[str, Any]
    rounds: pd.DataFrame
    summary: dict[str, Any]
    has_summary_file: bool = True

    # ------------------------------------------------------------------------------------------- columns
    def column(self, name: str) -> pd.Series | None:
        """The rounds column ``name`` as floats, or None when the run did not record it."""
        if name not in self.rounds.columns:
            return None
        return pd.to_numeric(self.rounds[name], errors="coerce").astype(float)

    def _last_finite(self, name: str) -> float | None:
        series = self.column(name)
        if series is None:
            return None
        series = series[series.map(math.isfinite)]
        return None if series.empty else float(series.iloc[-1])

    # ------------------------------------------------------------------------------------------- metrics
    @property
    def model_name(self) -> str | None:
        """``config.model.name``, if the config says."""
        return _section_name(self.config, "model")

    @property
    def data_name(self) -> str | None:
        """``config.data.name``, if the config says."""
        return _section_name(self.config, "data")

    @property
    def rounds_run(self) -> int:
        """How many rounds the table records (the summary's count if the table is empty)."""
        if len(self.rounds) > 0:
            return len(self.rounds)
        count = _finite(self.summary.get("rounds"))
        return 0 if count is None else int(count)

    def evaluated(self) -> pd.DataFrame:
        """The rounds that carry a test accuracy (NaN rows dropped), in table order."""
        acc = self.column("test_acc")
        if acc is None:
            return self.rounds.iloc[0:0]
        return self.rounds[acc.map(math.isfinite)]

    @property
    def final_test_acc(self) -> float | None:
        """Accuracy at the last evaluated round (summary's ``final_test_acc`` if no round was evaluated)."""
        value = self._last_finite("test_acc")
        return value if value is not None else _finite(self.summary.get("final_test_acc"))

    @property
    def best_test_acc(self) -> float | None:
        """Highest accuracy over the evaluated rounds (the final accuracy if no round was evaluated)."""
        acc = self.column("test_acc")
        if acc is not None:
            acc = acc[acc.map(math.isfinite)]
            if not acc.empty:
                return float(acc.max())
        return self.final_test_acc

    @property
    def baseline_acc(self) -> float | None:
        """The most-frequent-class baseline from the summary, if known."""
        return _finite(self.summary.get("baseline_acc"))

    @property
    def final_test_loss(self) -> float | None:
        """Test loss at the last round that recorded one."""
        return self._last_finite("test_loss")

    @property
    def sim_time_s(self) -> float:
        """Simulated seconds at the end of the run (0 when the simulated clock was not running)."""
        series = self.column("sim_time_s")
        if series is not None:
            series = series[series.map(math.isfinite)]
            if not series.empty:
                return float(series.max())
        value = _finite(self.summary.get("sim_time_s"))
        return 0.0 if value is None else value

    @property
    def wall_time_s(self) -> float | None:
        """Cumulative wall time at the last round (the summary's figure if the table lacks it)."""
        value = self._last_finite("wall_time_s")
        return value if value is not None else _finite(self.summary.get("wall_time_s"))

    @property
    def distinct_structures(self) -> int | None:
        """Distinct sub-model structures trained over the run (clients that ran; the full model counts as one), from
        ``clients.csv``; None when the run has no client records or did not record structures."""
        path = self.path / "clients.csv"
        if not path.is_file():
            return None
        clients = _read_csv(path, dtype={"units": str, "failure": str}, keep_default_na=False)
        if "units" not in clients.columns or "failure" not in clients.columns:
            return None
        ran = clients[clients["failure"] == ""]
        return int(ran["units"].nunique())

    @property
    def over_budget(self) -> int | None:
        """Client-rounds that trained although their model exceeded a budget (methods that ignore budgets)."""
        column = self.column("over_budget")
        return None if column is None else int(column.fillna(0).sum())

    @property
    def total_train_macs(self) -> float | None:
        """Multiply-accumulates of all clients' local training over the run (paper 002's training cost), or None
        when the run did not record them."""
        column = self.column("train_macs")
        return None if column is None else float(column.fillna(0.0).sum())

    @property
    def final_client_acc(self) -> float | None:
        """The average client accuracy at the last round that recorded one (data with per-client test sets)."""
        return self._last_finite("client_acc")

    @property
    def num_models(self) -> int | None:
        """Global models at the end of the run (FedTrans: the models it made, the initial one included)."""
        value = self._last_finite("num_models")
        return None if value is None else int(value)

    def client_accs(self) -> pd.DataFrame | None:
        """Each client's accuracy at the last evaluated round that recorded them (``client_accs.csv``), or None."""
        path = self.path / "client_accs.csv"
        if not path.is_file():
            return None
        rows = _read_csv(path, keep_default_na=False)
        if rows.empty or "round_idx" not in rows.columns:
            return None
        return rows[rows["round_idx"] == rows["round_idx"].max()].reset_index(drop=True)

    @property
    def total_bytes(self) -> int | None:
        """Bytes sent down plus bytes sent up over all rounds, or None when neither column exists."""
        parts = [self.column(name) for name in ("bytes_down", "bytes_up")]
        present = [part for part in parts if part is not None]
        if not present:
            return None
        return int(sum(float(part.fillna(0.0).sum()) for part in present))


# ----------------------------------------------------------------------------------------------- loading
def _read_rounds(run_dir: Path) -> pd.DataFrame:
    parquet = run_dir / ROUNDS_PARQUET
    csv = run_dir / ROUNDS_CSV
    if parquet.is_file():
        try:
            frame = pd.read_parquet(parquet)
        except Exception as err:  # whatever pyarrow raises for bytes that are not Parquet (ArrowInvalid, OSError, ...)
            if not csv.is_file():
                raise RunFileError(f"{_damaged(parquet, err)}; there is no {ROUNDS_CSV} beside it") from err
            rows = _read_csv(csv)
            if not _whole_rounds(csv, rows):
                raise RunFileError(f"{_damaged(parquet, err)}, and {csv} is not whole either") from err
            log.warning("%s; reading %s instead", _damaged(parquet, err), csv)
            frame = rows
        if csv.is_file():
            # the CSV gets every round as it finishes, the Parquet every few rounds and at the end: a run stopped
            # from outside (a Tune scheduler, a kill) leaves the CSV ahead
            rows = _read_csv(csv)
            if len(rows) > len(frame):
                log.info("%s: %s has more rounds than %s (run stopped early); reading it", run_dir, ROUNDS_CSV, parquet)
                frame = rows
    elif csv.is_file():
        log.warning("%s has no %s; reading %s instead", run_dir, ROUNDS_PARQUET, ROUNDS_CSV)
        frame = _read_csv(csv)
    else:
        raise FileNotFoundError(
            f"{run_dir} is not a run directory: {ROUNDS_PARQUET} (or {ROUNDS_CSV}) is missing (looked for {parquet})"
        )
    if "round_idx" in frame.columns:
        frame = frame.sort_values("round_idx", kind="stable").reset_index(drop=True)
    return frame


def _read_config(run_dir: Path) -> dict[str, Any]:
    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{run_dir} is not a run directory: {CONFIG_FILE} is missing (looked for {config_path})"
        )
    try:
        loaded = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise RunFileError(_damaged(config_path, err)) from err
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{config_path} should hold a YAML mapping, found {type(loaded).__name__}")
    return {str(key): value for key, value in loaded.items()}


def _read_summary(run_dir: Path) -> dict[str, Any] | None:
    summary_path = run_dir / SUMMARY_FILE
    if not summary_path.is_file():
        return None
    try:
        loaded = json.loads(summary_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:  # cut short by a full disk, or bytes that are not JSON
        log.warning("%s; deriving the summary from the rounds instead", _damaged(summary_path, err))
        return None
    if not isinstance(loaded, dict):
        raise ValueError(f"{summary_path} should hold a JSON object, found {type(loaded).__name__}")
    return {str(key): value for key, value in loaded.items()}


def load_run(path: str | Path) -> RunRecords:
    """Load one run directory.

    Args:
        path: the directory the engine wrote (``rounds.parquet``/``rounds.csv``, ``config.yaml`` and, for a
            finished run, ``summary.json``).

    Returns:
        The run's records. Without ``summary.json`` the summary is rebuilt from the rounds and the config
        (``baseline_acc`` is then unknown).

    Raises:
        FileNotFoundError: ``path`` does not exist, or lacks ``config.yaml`` or both round tables; the message
            names the missing file and the directory.
        NotADirectoryError: ``path`` is a file.
        ValueError: ``config.yaml`` or ``summary.json`` is not a mapping.
    """
    run_dir = Path(path)
    if not run_dir.exists():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    if not run_dir.is_dir():
        raise NotADirectoryError(f"{run_dir} is not a directory, so it cannot be a run directory")

    config = _read_config(run_dir)
    rounds = _read_rounds(run_dir)
    summary = _read_summary(run_dir)
    has_summary_file = summary is not None
    if summary is None:
        log.info("%s has no %s (interrupted run?); deriving the summary", run_dir, SUMMARY_FILE)
        summary = {}

    name = summary.get("name") or config.get("name") or run_dir.name
    algorithm = summary.get("algorithm") or _section_name(config, "algorithm") or "unknown"
    record = RunRecords(
        path=run_dir,
        name=str(name),
        algorithm=str(algorithm),
        config=config,
        rounds=rounds,
        summary=summary,
        has_summary_file=has_summary_file,
    )
    if not has_summary_file:
        summary.update(
            {
                "name": record.name,
                "algorithm": record.algorithm,
                "final_test_acc": record.final_test_acc,
                "baseline_acc": None,
                "rounds": record.rounds_run,
                "wall_time_s": record.wall_time_s,
                "sim_time_s": record.sim_time_s,
            }
        )
    return record


def unique_labels(runs: Sequence[RunRecords]) -> list[str]:
    """One display label per run: its name, with the directory name appended where names collide.

    ``["a", "a", "b"]`` from directories ``x/`` and ``y/`` becomes ``["a (x)", "a (y)", "b"]``; if even that
    collides (two directories with the same base name), a ``#n`` counter is added as well.
    """
    counts = Counter(run.name for run in runs)
    labels = [run.name if counts[run.name] == 1 else f"{run.name} ({run.path.name})" for run in runs]
    repeated = Counter(labels)
    seen: Counter[str] = Counter()
    result: list[str] = []
    for label in labels:
        if repeated[label] > 1:
            seen[label] += 1
            label = f"{label} #{seen[label]}"
        result.append(label)
    return result
