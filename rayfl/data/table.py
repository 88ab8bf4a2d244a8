"""Tables in: ``data.name: parquet`` (Parquet or Arrow IPC files) and ``data.name: hf`` (a Hugging Face data set).

Both sources end as Arrow tables (train, and test when the source has one), read the same way:

* samples from ``data.input_columns`` (empty: every numeric column but the label and client columns; the rule is
  ``table_schema.py``'s): one list column (nested lists too, e.g. HF's ``Array3D`` or a list of rows) whose rows all
  hold the same number of values, or several numeric columns stacked per row, reshaped to ``data.input_shape`` when
  given; or one column of encoded images (an HF ``Image``, a binary column of PNG/JPEG bytes), decoded when a client
  reads them (``encoded_images.py``). ``[C, H, W]`` samples are images (``uint8`` kept, integers in ``[0, 255]`` as
  ``uint8``, other numbers as ``float32``), ``[T]`` samples of one integer list column tokens, and a vector of floats
  or of several numeric columns a feature vector (``float32 [F]``, normalised per feature with the training rows'
  statistics, as images are per channel);
* labels from ``data.label_column``: integers, or strings numbered in sorted order (names kept in ``meta``);
* clients: ``data.partition: natural`` makes one client per distinct id of ``data.client_column`` (in order of first
  appearance, ``partition.natural``'s rule, then ``min_samples`` and ``num_clients``, 0 keeping all, as for LEAF);
  any other partition splits the labels (``partition.split``) with ``derive_rng(seed, "partition")`` and ignores the
  client column;
* the test set: ``data.test_path`` ('parquet') or ``data.test_split`` ('hf'); a source without one holds out
  ``data.test_fraction`` of its rows at random (``derive_rng(seed, "test-split")``).

Everything is column-wise numpy and Arrow work: no pass over the samples in Python; what loops is per client (names,
``max_samples_per_client``) or per label. Arrow files and ``save_to_disk`` folders are memory-mapped, and a column
stored as one chunk of fixed-width numbers without nulls becomes a numpy view of the mapped pages, not a copy; the
training rows are read through ``IndexedRows`` in client order when a client trains (no gathered copy). Parquet is
compressed and CSV text, so their columns are decoded into memory once.

Every fault in the data is one ``ConfigError`` naming the key (``data.label_column`` ...) and the file or data set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.core.rng import derive_rng
from rayfl.data import partition
from rayfl.data.client_names import NumberedNames
from rayfl.data.federated import FederatedDataset, IndexedRows, InputKind, LazyRows, Rows, take_rows
from rayfl.data.table_schema import (
    ARROW_SUFFIXES,
    CSV_SUFFIXES,
    file_kind,
    is_list,
    is_number,
    not_numbers,
    one_line,
    read_columns,
    reshaped,
    sample_kind,
    table_files,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["load_hf", "load_parquet", "table_dataset"]

_STATS_CHUNK = 8192  # rows per step of the channel statistics
_STATS_SAMPLE = 4096  # rows the statistics of encoded images are taken on


@dataclass(frozen=True)
class _Source:
    """A table read from somewhere (``where``: a file, folder or data set name, for errors)."""

    table: pa.Table
    where: str


# ------------------------------------------------------------------------------------------------ reading
def load_parquet(cfg: DataConfig, seed: int) -> FederatedDataset:
    """``data.name: parquet``: ``data.path`` (and ``data.test_path``) as Parquet, Arrow or CSV files or folders of
    them."""
    if cfg.path is None:
        raise ConfigError("data 'parquet' needs data.path: a Parquet, Arrow or CSV file, or a folder of them",
                          "data.path")  # fmt: skip
    train = _read_path(Path(cfg.path), cfg, "data.path")
    test = _read_path(Path(cfg.test_path), cfg, "data.test_path", test=True) if cfg.test_path is not None else None
    return table_dataset(train, test, cfg, seed, "parquet")


def _read_path(root: Path, cfg: DataConfig, key: str, test: bool = False) -> _Source:
    """The rows of every file under ``root`` (one file, or a folder's files in sorted path order), only the columns
    the run reads (a test set's: without the client column)."""
    import pyarrow as pa

    files = table_files(root, key)
    tables = [_read_file(path, cfg, key, test) for path in files]
    first = tables[0]
    for path, table in zip(files[1:], tables[1:], strict=True):
        if not table.schema.equals(first.schema, check_metadata=False):
            raise ConfigError(f"its columns ({_schema_text(table.schema)}) differ from the first file's "
                              f"({_schema_text(first.schema)})", key, file=str(path))  # fmt: skip
    return _Source(_plain(pa.concat_tables(tables) if len(tables) > 1 else first), str(root))


def _plain(table: pa.Table) -> pa.Table:
    """``table`` with every extension-typed column (Hugging Face's ``Array2D``-``Array5D``: nested lists underneath)
    as its storage, which the readers below understand; no copy."""
    import pyarrow as pa

    for i, f in enumerate(table.schema):
        if isinstance(f.type, pa.ExtensionType):
            chunks = [chunk.storage for chunk in table.column(i).chunks]
            table = table.set_column(i, f.name, pa.chunked_array(chunks, type=f.type.storage_type))
    return table


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def _read_file(path: Path, cfg: DataConfig, key: str, test: bool) -> pa.Table:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    try:
        if suffix in ARROW_SUFFIXES or suffix in CSV_SUFFIXES:
            table = _read_arrow(path) if suffix in ARROW_SUFFIXES else pacsv.read_csv(path)
            return table.select(read_columns(table.schema, cfg, str(path), test))
        schema = pq.read_schema(path)
        return pq.read_table(path, columns=read_columns(schema, cfg, str(path), test), memory_map=True)
    except (pa.ArrowException, OSError) as err:
        raise ConfigError(f"cannot be read as {file_kind(path)} file ({one_line(err)})", key, file=str(path)) from None


def _read_arrow(path: Path) -> pa.Table:
    """An Arrow IPC file or stream (what ``save_to_disk`` writes), memory-mapped: its buffers are the file's pages."""
    import pyarrow as pa

    try:
        return pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_stream(pa.memory_map(str(path))).read_all()


def load_hf(cfg: DataConfig, seed: int) -> FederatedDataset:
    """``data.name: hf``: a Hugging Face data set, ``data.path`` (a ``save_to_disk`` folder, read with
    ``load_from_disk``, or a local data set folder, read with ``load_dataset``) or ``data.hf_name`` (``load_dataset``
    by name, from its cache in ``data.root``); ``data.split`` trains and ``data.test_split`` tests."""
    try:
        import datasets
    except ImportError:
        raise ConfigError("data 'hf' needs the Hugging Face datasets package: pip install 'rayfl[hf]'",
                          "data.name") from None  # fmt: skip
    if cfg.path is not None:
        where, key = cfg.path, "data.path"
    elif cfg.hf_name:
        where, key = cfg.hf_name, "data.hf_name"
    else:
        raise ConfigError("data 'hf' needs data.path (a save_to_disk folder or a local data set folder) or "
                          "data.hf_name", "data.path")  # fmt: skip
    folder = Path(where)
    saved = cfg.path is not None and ((folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file())
    try:
        loaded: Any = datasets.load_from_disk(where) if saved else datasets.load_dataset(where, cache_dir=cfg.root)
    except Exception as err:  # the library's own errors are many kinds; each is one line here
        raise ConfigError(f"cannot be loaded as a Hugging Face data set ({type(err).__name__}: {one_line(err)})",
                          key, file=where) from None  # fmt: skip
    test = None
    if isinstance(loaded, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        splits = ", ".join(loaded)
        if cfg.split not in loaded:
            raise ConfigError(f"has no split {cfg.split!r} (splits: {splits})", "data.split", file=where)
        train = loaded[cfg.split]
        if cfg.test_split in loaded and cfg.test_split != cfg.split:
            test = loaded[cfg.test_split]
    else:
        train = loaded
    if not isinstance(train, datasets.Dataset) or (test is not None and not isinstance(test, datasets.Dataset)):
        raise ConfigError("is a streaming (iterable) data set; rayfl reads a map-style one", key, file=where)
    return table_dataset(
        _hf_source(train, cfg, f"{where}[{cfg.split}]"),
        _hf_source(test, cfg, f"{where}[{cfg.test_split}]", test=True) if test is not None else None,
        cfg,
        seed,
        "hf",
    )


def _hf_source(ds: Any, cfg: DataConfig, where: str, test: bool = False) -> _Source:
    """A split's rows as an Arrow table (its memory-mapped table itself when no index mapping selects its rows)."""
    table = ds.with_format("arrow")[0 : len(ds)]
    return _Source(_plain(table.select(read_columns(table.schema, cfg, where, test))), where)


# --------------------------------------------------------------------------------------------- to samples
def table_dataset(
    train: _Source, test: _Source | None, cfg: DataConfig, seed: int, name: str
) -> FederatedDataset:
    """The federated data set of ``train``'s rows (and ``test``'s, else ``data.test_fraction`` of ``train``)."""
    x_all, kind = _samples(train, cfg)
    names = _label_names(train, test, cfg)
    y_all = _labels(train, cfg, names)
    n = len(y_all)
    if test is not None:
        x_test, _ = _samples(test, cfg)
        if x_test.shape[1:] != x_all.shape[1:]:
            raise ConfigError(f"test samples have shape {list(x_test.shape[1:])}, training samples "
                              f"{list(x_all.shape[1:])}", "data.input_columns", file=test.where)  # fmt: skip
        y_test = _labels(test, cfg, names)
        rows = np.arange(n, dtype=np.int64)
    else:
        perm = derive_rng(seed, "test-split").permutation(n)
        k = min(max(round(cfg.test_fraction * n), 1), n - 1) if n >= 2 else 0
        held, rows = np.sort(perm[:k]).astype(np.int64), np.sort(perm[k:]).astype(np.int64)
        x_test, y_test = take_rows(x_all, held), y_all[held]
    if len(y_test) == 0:
        raise ConfigError("the test set is empty", "data.test_path" if name == "parquet" else "data.test_split",
                          file=test.where if test is not None else train.where)  # fmt: skip
    num_classes = cfg.num_classes or int(max(y_all.max(initial=0), y_test.max(initial=0))) + 1
    for where, y in ((train.where, y_all), (test.where if test is not None else train.where, y_test)):
        if len(y) and int(y.max()) >= num_classes:
            raise ConfigError(f"labels reach {int(y.max())}, outside [0, {num_classes}) (data.num_classes)",
                              "data.label_column", file=where)  # fmt: skip
    if num_classes < 2:
        raise ConfigError(f"holds {num_classes} label(s); classification needs at least 2", "data.label_column",
                          file=train.where)  # fmt: skip

    parts, client_names = _clients(train, cfg, seed, y_all, rows)
    parts = partition.cap_per_client(parts, cfg.max_samples_per_client, derive_rng(seed, "partition_cap"))
    order = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    meta: dict[str, object] = {"partition": cfg.partition, "source": train.where}
    if names is not None:
        meta["classes"] = list(names)
    if kind != "tokens":  # images are normalised per channel, feature vectors per feature
        meta.update(_channel_stats(x_all, order, derive_rng(seed, "channel-stats")))
        meta.update({"layout": "NCHW"} if kind == "image" else {"columns": _inputs(train, cfg)})
    return FederatedDataset(
        name=name,
        input_kind=kind,
        num_classes=num_classes,
        x=take_rows(x_all, order) if isinstance(x_all, LazyRows) else IndexedRows(x_all, order),  # read when trained
        y=y_all[order],
        offsets=offsets,
        x_test=x_test,
        y_test=y_test,
        client_names=client_names,
        meta=meta,
    )


def _clients(
    train: _Source, cfg: DataConfig, seed: int, y_all: np.ndarray, rows: npt.NDArray[np.int64]
) -> tuple[list[npt.NDArray[np.int64]], Sequence[str]]:
    """Each client's training rows (positions in ``train``) and the clients' names."""
    if cfg.partition != "natural":  # the client column, if any, is not read
        try:
            parts = partition.split(
                cfg.partition, y_all[rows], cfg.num_clients, derive_rng(seed, "partition"),
                alpha=cfg.dirichlet_alpha, shards_per_client=cfg.shards_per_client,
                classes_per_client=cfg.classes_per_client,
            )  # fmt: skip
        except ValueError as err:
            raise ConfigError(str(err), "data.partition", file=train.where) from None
        width = max(4, len(str(cfg.num_clients - 1)))
        return [rows[p] for p in parts], NumberedNames("client", len(parts), width)
    if not cfg.client_column:
        raise ConfigError("partition 'natural' needs data.client_column (the column of client ids); or pick a "
                          "partitioner (iid, dirichlet, shards, pathological, size_skew)", "data.partition",
                          file=train.where)  # fmt: skip
    import pyarrow as pa
    import pyarrow.compute as pc

    column = train.table.column(cfg.client_column)
    if column.null_count:
        raise ConfigError(f"column {cfg.client_column!r} has {column.null_count} empty id(s)", "data.client_column",
                          file=train.where)  # fmt: skip
    encoded = pc.dictionary_encode(column.combine_chunks())  # codes in order of first appearance
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)[rows]
    parts = partition.natural(codes)  # clients in order of first appearance among the training rows
    firsts = np.array([int(codes[p[0]]) for p in parts], dtype=np.int64)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    keep = np.flatnonzero(sizes >= cfg.min_samples)[: cfg.num_clients or None]  # 0: every client
    if len(keep) == 0:
        raise ConfigError(f"no client id has {cfg.min_samples} training rows (data.min_samples); the largest has "
                          f"{int(sizes.max(initial=0))}", "data.client_column", file=train.where)  # fmt: skip
    ids = encoded.dictionary.take(pa.array(firsts[keep])).to_pylist()
    return [rows[parts[i]] for i in keep.tolist()], tuple(str(v) for v in ids)


def _inputs(source: _Source, cfg: DataConfig) -> list[str]:
    """The sample columns of ``source``'s table, which holds only the columns the run reads (``read_columns``)."""
    names = source.table.schema.names
    return list(cfg.input_columns) or [n for n in names if n not in (cfg.label_column, cfg.client_column)]


def _samples(source: _Source, cfg: DataConfig) -> tuple[Rows, InputKind]:
    """The sample array of ``source`` (``[N, C, H, W]`` images, ``[N, T]`` tokens or ``[N, F]`` feature vectors) and
    its kind (``table_schema.sample_kind``); encoded images as ``EncodedImages``, decoded when read."""
    from rayfl.data.encoded_images import encoded_images, is_encoded

    table = source.table
    inputs = _inputs(source, cfg)
    if len(inputs) == 1 and is_encoded(table.schema.field(inputs[0]).type):
        images = encoded_images(table.column(inputs[0]), inputs[0], source.where)
        if cfg.input_shape and tuple(cfg.input_shape) != images.shape[1:]:
            raise ConfigError(f"is {list(cfg.input_shape)}, but the images of column {inputs[0]!r} decode to "
                              f"{list(images.shape[1:])}", "data.input_shape", file=source.where)  # fmt: skip
        return images, "image"
    stacked = not (len(inputs) == 1 and is_list(table.schema.field(inputs[0]).type))
    if not stacked:
        x = _list_column(table.column(inputs[0]), inputs[0], source.where)
    else:
        columns = []
        for name in inputs:
            column = table.column(name)
            if not is_number(column.type):
                what = "lists" if is_list(column.type) else f"{column.type} values"
                raise not_numbers(inputs, cfg, name, what, _encoded_hint(column.type), source.where)
            if column.null_count:
                raise ConfigError(f"column {name!r} has {column.null_count} empty value(s)", "data.input_columns",
                                  file=source.where)  # fmt: skip
            columns.append(np.asarray(column.to_numpy()))
        x = np.stack(columns, axis=1) if columns else np.zeros((table.num_rows, 0))
    shape = [int(d or 0) for d in reshaped(list(x.shape[1:]), inputs, cfg, source.where)]
    x = x.reshape(len(x), *shape)
    integer = bool(np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_)
    kind = sample_kind(shape, integer, stacked, cfg, source.where)
    if kind == "image":
        return _image_dtype(x), kind
    if kind == "tokens":
        return x.astype(np.int64, copy=False), kind
    return x.astype(np.float32, copy=False), kind  # a feature vector


def _encoded_hint(t: pa.DataType) -> str:
    from rayfl.data.encoded_images import is_encoded

    if is_encoded(t):
        return " (encoded images are read as the only sample column: data.input_columns: [that column])"
    return ""


def _list_column(column: pa.ChunkedArray, name: str, where: str) -> np.ndarray:
    """A (nested) list column whose rows all have one shape, as ``[N, *shape]``: the flattened values reshaped."""
    import pyarrow as pa

    key = "data.input_columns"
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    n, dims = len(array), []
    while is_list(array.type):
        if array.null_count:
            raise ConfigError(f"column {name!r} has {array.null_count} empty list(s)", key, file=where)
        if pa.types.is_fixed_size_list(array.type):
            dims.append(int(array.type.list_size))
        else:
            lengths = np.asarray(array.value_lengths().to_numpy(zero_copy_only=False))
            low, high = (int(lengths.min()), int(lengths.max())) if len(lengths) else (0, 0)
            if low != high:
                raise ConfigError(f"column {name!r} holds lists of {low} to {high} values; every sample needs one "
                                  "shape (pad or cut them to one length)", key, file=where)  # fmt: skip
            dims.append(low)
        array = array.flatten()
    if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type) or pa.types.is_boolean(array.type)):
        raise ConfigError(f"column {name!r} holds lists of {array.type}; samples need numbers"
                          f"{_encoded_hint(array.type)}", key, file=where)  # fmt: skip
    if array.null_count:
        raise ConfigError(f"column {name!r} has {array.null_count} empty value(s) in its lists", key, file=where)
    values = np.asarray(array.to_numpy(zero_copy_only=False))  # a view of the (mapped) buffer where Arrow allows
    return values.reshape(n, *dims)


def _image_dtype(x: np.ndarray) -> np.ndarray:
    """Pixels as rayfl stores images: ``uint8`` and ``float32`` kept, integers within ``[0, 255]`` as ``uint8``,
    other numbers as ``float32``."""
    if x.dtype in (np.uint8, np.float32):
        return x
    if np.issubdtype(x.dtype, np.integer) and (x.size == 0 or (int(x.min()) >= 0 and int(x.max()) <= 255)):
        return x.astype(np.uint8)
    return x.astype(np.float32)


def _label_names(train: _Source, test: _Source | None, cfg: DataConfig) -> np.ndarray | None:
    """String labels' names in sorted order (train and test together: they number the classes), else ``None``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = train.table.column(cfg.label_column).type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return None
    sources = [train] + ([test] if test is not None else [])
    distinct = [pc.unique(_decoded(s.table.column(cfg.label_column)).combine_chunks()).drop_null() for s in sources]
    return np.unique(np.concatenate([np.asarray(d.to_numpy(zero_copy_only=False), dtype=object) for d in distinct]))


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    import pyarrow as pa

    return column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column


def _labels(source: _Source, cfg: DataConfig, names: np.ndarray | None) -> npt.NDArray[np.int64]:
    """The label column as ``int64`` class ids (string labels by their position in ``names``)."""
    import pyarrow as pa

    key, column = "data.label_column", _decoded(source.table.column(cfg.label_column))
    if column.null_count:
        raise ConfigError(f"column {cfg.label_column!r} has {column.null_count} empty label(s)", key, file=source.where)
    t = column.type
    if names is not None and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        values = np.asarray(column.to_numpy(), dtype=object)
        return np.searchsorted(names, values).astype(np.int64)
    if not (pa.types.is_integer(t) or pa.types.is_boolean(t)):
        raise ConfigError(f"column {cfg.label_column!r} holds {t}; labels are integers or strings", key,
                          file=source.where)  # fmt: skip
    y = np.array(column.to_numpy(), dtype=np.int64)  # an own, writable copy (torch reads labels in place)
    if len(y) and int(y.min()) < 0:
        raise ConfigError(f"column {cfg.label_column!r} has negative labels (the smallest is {int(y.min())})", key,
                          file=source.where)  # fmt: skip
    return y


def _channel_stats(x: Rows, rows: npt.NDArray[np.int64], rng: np.random.Generator) -> dict[str, list[float]]:
    """Per-channel (image) or per-feature (feature vector: axis 1 too) mean and standard deviation of the training
    rows (on ``to_input``'s scale: 0-1 for ``uint8`` pixels), in float64, a chunk of rows at a time; of
    ``_STATS_SAMPLE`` random training rows when the rows are decoded when read (encoded images: set-up decodes no more
    than those)."""
    if isinstance(x, LazyRows) and len(rows) > _STATS_SAMPLE:
        rows = rng.choice(rows, size=_STATS_SAMPLE, replace=False)
    channels = x.shape[1]
    total, squares, count = np.zeros(channels), np.zeros(channels), 0
    scale = 1.0 / 255.0 if x.dtype == np.uint8 else 1.0
    for lo in range(0, len(rows), _STATS_CHUNK):
        chunk = np.asarray(x[np.sort(rows[lo : lo + _STATS_CHUNK])], dtype=np.float64) * scale
        axes = (0, *range(2, chunk.ndim))
        total += chunk.sum(axis=axes)
        squares += np.square(chunk).sum(axis=axes)
        count += chunk.size // channels
    if count == 0:
        return {}
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return {"mean": [float(v) for v in mean], "std": [float(max(v, 1e-6)) for v in std]}
