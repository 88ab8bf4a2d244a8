"""A memory map pickled by path (``rayfl/data/mapped_file.py``, ``IndexedRows.shipped_by_path``): the reader maps the
same rows again, in the same order, and the pickle holds no sample; a file changed or gone since is one line naming
the path and the node; what cannot be named by path (arrays in memory, copy-on-write maps) is not."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from rayfl.core.errors import ConfigError
from rayfl.data.federated import IndexedRows
from rayfl.data.mapped_file import mapped_file, open_mapped


def _saved(tmp_path: Path, order: str = "C") -> tuple[Path, np.ndarray]:
    x = np.asarray(np.random.default_rng(0).integers(0, 256, (300, 3, 4, 4), dtype=np.uint8), order=order)
    path = tmp_path / "x.npy"
    np.save(path, x)
    return path, x


def _round_trip(rows: IndexedRows) -> IndexedRows:
    out = pickle.loads(pickle.dumps(rows, protocol=5))
    assert isinstance(out, IndexedRows)
    return out


def test_a_map_pickled_by_path_gives_the_same_rows_in_the_same_order(tmp_path: Path) -> None:
    path, x = _saved(tmp_path)
    order = np.random.default_rng(1).permutation(len(x)).astype(np.int64)
    rows = IndexedRows(np.load(path, mmap_mode="r"), order).shipped_by_path()
    blob = pickle.dumps(rows, protocol=5)
    assert len(blob) < order.nbytes + 1000  # the order and the file's name, no sample
    back = _round_trip(rows)
    np.testing.assert_array_equal(back[np.arange(len(x))], x[order])
    np.testing.assert_array_equal(back[17:40], x[order][17:40])
    assert back.by_path and back.file == rows.file  # passed on again, it still goes by path
    plain = IndexedRows(np.load(path, mmap_mode="r"), order)  # the object store's way: the bytes, out of band
    assert len(pickle.dumps(plain, protocol=5)) > x.nbytes
    np.testing.assert_array_equal(_round_trip(plain)[:], back[:])


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_slice_of_a_map_names_its_own_block(tmp_path: Path, order: str) -> None:
    path, x = _saved(tmp_path, order)
    whole = np.load(path, mmap_mode="r")
    part = whole[..., 1] if order == "F" else whole[120:180]  # a contiguous block either way
    file = mapped_file(part)
    assert file is not None and file.shape == part.shape and file.fortran_order == (order == "F")
    np.testing.assert_array_equal(open_mapped(file), x[..., 1] if order == "F" else x[120:180])
    np.testing.assert_array_equal(_round_trip(IndexedRows(part, by_path=True))[:], np.asarray(part))


def test_only_a_read_only_map_of_a_block_goes_by_path(tmp_path: Path) -> None:
    path, x = _saved(tmp_path)
    assert mapped_file(x) is None  # in memory
    assert mapped_file(np.load(path, mmap_mode="c")) is None  # copy-on-write: may differ from the file
    assert mapped_file(np.load(path, mmap_mode="r")[::2]) is None  # strided: no single block
    with pytest.raises(ValueError, match="only a read-only memory map"):
        IndexedRows(x).shipped_by_path()


@pytest.mark.parametrize("change", ["rewritten", "touched", "removed"])
def test_a_file_changed_or_gone_is_one_line_naming_the_path_and_the_node(tmp_path: Path, change: str) -> None:
    path, x = _saved(tmp_path)
    blob = pickle.dumps(IndexedRows(np.load(path, mmap_mode="r"), by_path=True), protocol=5)
    if change == "rewritten":
        np.save(path, x[:-1])
    elif change == "touched":  # the same bytes, another time: a copy not made with its time kept
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    else:
        path.unlink()
    with pytest.raises(ConfigError) as err:
        pickle.loads(blob)
    message = str(err.value)
    # the node: its host name, or its Ray node address when this process is connected to Ray (an earlier test may
    # have connected it)
    assert "\n" not in message and str(path) in message and (" on host " in message or " on Ray node " in message), (
        message
    )
    assert "data.ship: object_store" in message, message
