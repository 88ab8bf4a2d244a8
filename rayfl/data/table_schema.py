"""Which columns of a table are the samples, what kind of input they make, and what ``rayfl validate`` reads of a
table file without reading its rows. The reader (``table.py``) and the check before a run decide alike from here.

* **Columns.** ``data.input_columns`` when given. Else every numeric column (integers, floats, booleans) but the label
  and client columns, stacked per row into a feature vector; other columns (strings, dates, ...) are left out. When
  the label and client columns leave one column, it is the samples whatever it holds (a list column, encoded images).
  A table with both numeric and list or image columns, or several list columns, names its samples in
  ``data.input_columns``. The client column is read by ``partition: natural`` only: the partitioners ignore it, and it
  is never an input unless ``data.input_columns`` names it.
* **Kind** (``sample_kind``): ``[C, H, W]`` samples are images; one list column of integers (or booleans) gives
  tokens; a vector of floats, or of several numeric columns, is a feature vector (``[F]``, float32), unless
  ``data.input_shape`` reshapes it (``[C, H, W]``: images; ``[T]``: tokens when the values are integers).
* **Validate** (``describe_table``): the files' schemas and row counts (Parquet and Arrow IPC footers; a CSV file's
  first block, for its columns only), the label's range from Parquet column statistics; from them the input kind,
  sample shape and class count the run will see, and every refusal the reader makes from the columns alone, each one
  ``ConfigError`` naming the key and the file.

Imports neither torch nor Ray; pyarrow only when called.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.data.federated import InputKind

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ARROW_SUFFIXES",
    "CSV_SUFFIXES",
    "PARQUET_SUFFIXES",
    "TableSummary",
    "columns_text",
    "default_inputs",
    "describe_table",
    "file_kind",
    "is_list",
    "is_number",
    "not_numbers",
    "one_line",
    "read_columns",
    "reshaped",
    "sample_kind",
    "table_files",
]

PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
CSV_SUFFIXES = (".csv",)


def table_files(root: Path, key: str) -> list[Path]:
    """``root`` itself, or the table files under it in sorted path order."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ConfigError("does not exist", key, file=str(root))
    suffixes = PARQUET_SUFFIXES + ARROW_SUFFIXES + CSV_SUFFIXES
    found = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    if not found:
        raise ConfigError("holds no Parquet (.parquet), Arrow (.arrow, .feather) or CSV (.csv) files", key,
                          file=str(root))  # fmt: skip
    return found


def is_list(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def is_number(t: pa.DataType) -> bool:
    """An integer, floating-point or boolean scalar type: a column that can be one value of a feature vector."""
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def _is_integer(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_boolean(t))


# ------------------------------------------------------------------------------------------------ columns
def read_columns(schema: pa.Schema, cfg: DataConfig, where: str, test: bool = False) -> list[str]:
    """The columns the run reads, inputs first, each checked to exist: the inputs, the label, the client ids (for
    partition 'natural' only, and not in a test set, which has no clients)."""
    have = set(schema.names)
    listed = ", ".join(schema.names)
    wanted = [("data.label_column", cfg.label_column)]
    if cfg.client_column and cfg.partition == "natural" and not test:
        wanted.append(("data.client_column", cfg.client_column))
    wanted += [("data.input_columns", c) for c in cfg.input_columns]
    for key, column in wanted:
        if column not in have:
            raise ConfigError(f"no column {column!r} (columns: {listed})", key, file=where)
    inputs = list(cfg.input_columns) or default_inputs(schema, cfg, where)
    return [*inputs, *(c for _, c in wanted if c not in inputs)]


def default_inputs(schema: pa.Schema, cfg: DataConfig, where: str) -> list[str]:
    """The sample columns when ``data.input_columns`` is empty (see the module docstring)."""
    from rayfl.data.encoded_images import is_encoded

    rest = [f for f in schema if f.name not in (cfg.label_column, cfg.client_column)]
    key = "data.input_columns"
    if len(rest) == 1:
        return [rest[0].name]
    numbers = [f.name for f in rest if is_number(f.type)]
    arrays = [f.name for f in rest if is_list(f.type) or is_encoded(f.type)]
    if numbers and not arrays:
        return numbers
    if len(arrays) == 1 and not numbers:
        return arrays
    typed = ", ".join(f"{f.name}: {f.type}" for f in rest)
    if not rest:
        raise ConfigError(f"no column is left for the samples (columns: {', '.join(schema.names)})", key, file=where)
    if not numbers and not arrays:
        raise ConfigError(f"no column holds numbers for the samples ({typed}): name the sample column(s) in "
                          "data.input_columns", key, file=where)  # fmt: skip
    raise ConfigError(f"is empty and the columns {numbers + arrays} could each be samples ({typed}): name the "
                      "sample column(s) in data.input_columns", key, file=where)  # fmt: skip


def not_numbers(inputs: Sequence[str], cfg: DataConfig, name: str, what: str, hint: str, where: str) -> ConfigError:
    """The refusal of a sample column ``name`` that holds ``what`` (not numbers)."""
    chosen = "" if cfg.input_columns else " (data.input_columns is empty: the one column besides the label and client"
    chosen += "" if cfg.input_columns else " columns)"
    return ConfigError(f"samples from columns {columns_text(inputs)}{chosen}: column {name!r} holds {what}; samples "
                       f"are one list column or several numeric columns{hint}", "data.input_columns",
                       file=where)  # fmt: skip


def columns_text(names: Sequence[str]) -> str:
    """A list of column names for an error, its middle left out when it is long (a table of many features)."""
    if len(names) <= 8:
        return str(list(names))
    return f"[{', '.join(repr(n) for n in names[:3])}, ..., {names[-1]!r}] ({len(names)} columns)"


def sample_kind(shape: Sequence[int | None], integer: bool, stacked: bool, cfg: DataConfig, where: str) -> InputKind:
    """The kind of input of samples of ``shape`` (after ``data.input_shape``), ``integer`` values or not, ``stacked``
    from several scalar columns or one list column (see the module docstring)."""
    if len(shape) == 3:
        return "image"
    if len(shape) == 1:
        return "tokens" if integer and (not stacked or cfg.input_shape) else "features"
    text = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
    raise ConfigError(f"samples of shape {text}: set data.input_shape to [C, H, W] (images), [T] (integer tokens) or "
                      "[F] (a feature vector)", "data.input_shape", file=where)  # fmt: skip


def reshaped(shape: Sequence[int | None], inputs: Sequence[str], cfg: DataConfig, where: str) -> list[int | None]:
    """``shape`` as ``data.input_shape`` gives it (checked to hold as many values where ``shape`` is known)."""
    if not cfg.input_shape:
        return list(shape)
    want = math.prod(cfg.input_shape)
    if all(d is not None for d in shape) and math.prod(d or 0 for d in shape) != want:
        have = math.prod(d or 0 for d in shape)
        raise ConfigError(f"{list(cfg.input_shape)} holds {want} values, but a sample of {columns_text(inputs)} "
                          f"holds {have}", "data.input_shape", file=where)  # fmt: skip
    return list(cfg.input_shape)


# ------------------------------------------------------------------------------------------------ validate
@dataclass(frozen=True)
class TableSummary:
    """What a table gives, read from its metadata. ``None``: only the rows tell (lists of varying length, encoded
    images, labels without Parquet statistics, a CSV file's row count)."""

    where: str
    rows: int | None
    inputs: tuple[str, ...]
    input_kind: InputKind
    sample_shape: tuple[int, ...] | None
    num_classes: int | None


def describe_table(cfg: DataConfig) -> TableSummary:
    """``data.name: parquet``'s files as the run will read them, from their schemas and footers only (no rows read);
    raises what the reader would from the columns alone."""
    if cfg.path is None:
        raise ConfigError("data 'parquet' needs data.path: a Parquet, Arrow or CSV file, or a folder of them",
                          "data.path")  # fmt: skip
    files = table_files(Path(cfg.path), "data.path")
    schema = _same_schema(files, "data.path")
    where = str(files[0]) if len(files) == 1 else cfg.path
    columns = read_columns(schema, cfg, where)
    test_files = table_files(Path(cfg.test_path), "data.test_path") if cfg.test_path is not None else []
    if test_files:
        read_columns(_same_schema(test_files, "data.test_path"), cfg, cfg.test_path or "", test=True)
    label_problem = _label_type_problem(schema.field(cfg.label_column).type)
    if label_problem:
        raise ConfigError(f"column {cfg.label_column!r} holds {label_problem}; labels are integers or strings",
                          "data.label_column", file=where)  # fmt: skip
    inputs = columns[: len(cfg.input_columns) or len(default_inputs(schema, cfg, where))]
    kind, shape = _schema_samples(schema, inputs, cfg, where)
    counts = [_file_rows(p) for p in files]
    rows = None if any(c is None for c in counts) else sum(c or 0 for c in counts)
    if rows is not None:
        _check_rows(rows, cfg, where)
    num_classes = _num_classes(files + test_files, cfg, where)
    if num_classes is not None and num_classes < 2:
        raise ConfigError(f"holds {num_classes} label(s); classification needs at least 2", "data.label_column",
                          file=where)  # fmt: skip
    return TableSummary(where, rows, tuple(inputs), kind, shape, num_classes)


def _same_schema(files: list[Path], key: str) -> pa.Schema:
    first = _file_schema(files[0], key)
    for path in files[1:]:
        schema = _file_schema(path, key)
        if not schema.equals(first, check_metadata=False):
            raise ConfigError(f"its columns ({_schema_text(schema)}) differ from the first file's "
                              f"({_schema_text(first)})", key, file=str(path))  # fmt: skip
    return first


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def _file_schema(path: Path, key: str) -> pa.Schema:
    """A file's columns from its footer (Parquet, Arrow IPC) or first block (CSV)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    try:
        if suffix in ARROW_SUFFIXES:
            try:
                return pa.ipc.open_file(pa.memory_map(str(path))).schema
            except pa.ArrowInvalid:
                return pa.ipc.open_stream(pa.memory_map(str(path))).schema
        if suffix in CSV_SUFFIXES:
            return pacsv.open_csv(path).schema
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:
        raise ConfigError(f"cannot be read as {file_kind(path)} file ({one_line(err)})", key, file=str(path)) from None


def file_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    return "an Arrow IPC" if suffix in ARROW_SUFFIXES else "a CSV" if suffix in CSV_SUFFIXES else "a Parquet"


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _file_rows(path: Path) -> int | None:
    """Rows of a file from its footer; ``None`` for CSV files and Arrow streams (only a full read counts them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    if suffix in CSV_SUFFIXES:
        return None
    if suffix in ARROW_SUFFIXES:
        try:
            return int(pa.ipc.open_file(pa.memory_map(str(path))).count_rows())
        except pa.ArrowInvalid:
            return None
    return int(pq.read_metadata(path).num_rows)


def _label_type_problem(t: pa.DataType) -> str:
    import pyarrow as pa

    base = t.value_type if pa.types.is_dictionary(t) else t
    if _is_integer(base) or pa.types.is_string(base) or pa.types.is_large_string(base):
        return ""
    return str(base)


def _schema_samples(
    schema: pa.Schema, inputs: Sequence[str], cfg: DataConfig, where: str
) -> tuple[InputKind, tuple[int, ...] | None]:
    """The kind and shape of the samples the columns ``inputs`` give (shape ``None`` where only the rows tell)."""
    import pyarrow as pa

    from rayfl.data.encoded_images import is_encoded

    types = [schema.field(name).type for name in inputs]
    if len(inputs) == 1 and is_encoded(types[0]):
        return "image", tuple(cfg.input_shape) if cfg.input_shape else None
    if len(inputs) == 1 and is_list(types[0]):
        t, dims = types[0], []
        while is_list(t):
            dims.append(int(t.list_size) if pa.types.is_fixed_size_list(t) else None)
            t = t.value_type
        if not is_number(t):
            raise ConfigError(f"column {inputs[0]!r} holds lists of {t}; samples need numbers", "data.input_columns",
                              file=where)  # fmt: skip
        integer, stacked = _is_integer(t), False
    else:
        for name, t in zip(inputs, types, strict=True):
            if not is_number(t):
                what = "lists" if is_list(t) else f"{t} values"
                hint = " (encoded images are read as the only sample column)" if is_encoded(t) else ""
                raise not_numbers(inputs, cfg, name, what, hint, where)
        dims, integer, stacked = [len(inputs)], all(_is_integer(t) for t in types), True
    shape = reshaped(dims, inputs, cfg, where)
    kind = sample_kind(shape, integer, stacked, cfg, where)
    known = None if any(d is None for d in shape) else tuple(int(d or 0) for d in shape)
    return kind, known


def _check_rows(rows: int, cfg: DataConfig, where: str) -> None:
    """The training rows a partitioner splits: every client needs one."""
    if rows == 0:
        raise ConfigError("holds no rows", "data.path", file=where)
    held = 0 if cfg.test_path is not None else min(max(round(cfg.test_fraction * rows), 1), rows - 1)
    train = rows - held if rows >= 2 else rows
    if cfg.partition != "natural" and cfg.num_clients > train:
        raise ConfigError(f"{cfg.num_clients} clients cannot each get one of the {train} training rows",
                          "data.num_clients", file=where)  # fmt: skip


def _num_classes(files: list[Path], cfg: DataConfig, where: str) -> int | None:
    """``data.num_classes``, else the largest label + 1 from the Parquet files' column statistics (``None`` when a
    file has none: CSV, Arrow, string labels, statistics not written)."""
    import pyarrow.parquet as pq

    if cfg.num_classes:
        return cfg.num_classes
    if any(p.suffix.lower() not in PARQUET_SUFFIXES for p in files):
        return None
    low, high = None, None
    for path in files:
        meta = pq.read_metadata(path)
        index = [meta.schema.column(j).path for j in range(meta.num_columns)]
        if cfg.label_column not in index:
            return None
        j = index.index(cfg.label_column)
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(j).statistics
            if meta.row_group(g).num_rows == 0:
                continue
            if stats is None or not stats.has_min_max or not isinstance(stats.max, int | bool):
                return None
            low = int(stats.min) if low is None else min(low, int(stats.min))
            high = int(stats.max) if high is None else max(high, int(stats.max))
    if low is not None and low < 0:
        raise ConfigError(f"column {cfg.label_column!r} has negative labels (the smallest is {low})",
                          "data.label_column", file=where)  # fmt: skip
    return None if high is None else high + 1
