"""How a Ray run ships a data set of memory maps (``rayfl/engine/ray/data_ship.py``), without a cluster: every mapped
field of an on-disk set (its validation split included) goes by path with the same rows; ``auto`` falls back to the
object store with one log line when some node cannot read the files, ``path`` refuses in one line, and data without
maps is left as it is."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest

from rayfl.core.errors import ConfigError
from rayfl.data.federated import FederatedDataset, IndexedRows, RowSubset, hold_out_validation
from rayfl.data.on_disk import natural_dataset
from rayfl.engine.ray import data_ship

FIELDS = ("x", "y", "x_test", "y_test", "x_val", "y_val")


def _on_disk(folder: Path) -> FederatedDataset:
    rng = np.random.default_rng(0)
    paths = {k: str(folder / f"{k}.npy") for k in ("x", "y", "client_ids", "x_test", "y_test")}
    np.save(paths["x"], rng.integers(0, 256, (120, 1, 4, 4), dtype=np.uint8))
    np.save(paths["y"], rng.integers(0, 10, 120))
    np.save(paths["client_ids"], rng.integers(0, 6, 120))  # rows not grouped by client: an order is kept
    np.save(paths["x_test"], rng.integers(0, 256, (20, 1, 4, 4), dtype=np.uint8))
    np.save(paths["y_test"], rng.integers(0, 10, 20))
    ds = natural_dataset(num_classes=10, **paths)
    return hold_out_validation(ds, 0.25, np.random.default_rng(3))


def test_every_mapped_field_goes_by_path_with_the_same_rows(tmp_path: Path) -> None:
    ds = _on_disk(tmp_path)
    assert isinstance(ds.x, RowSubset) and isinstance(ds.x_val, RowSubset)  # the validation split of the maps
    assert {Path(f.path).name for f in data_ship.mapped_files(ds)} == {"x.npy", "y.npy", "x_test.npy"}
    shipped = pickle.loads(pickle.dumps(data_ship.by_path(ds), protocol=5))
    assert isinstance(shipped.x, RowSubset) and isinstance(shipped.x.base, IndexedRows) and shipped.x.base.by_path
    for name in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(shipped, name)), np.asarray(getattr(ds, name)), name)
    np.testing.assert_array_equal(shipped.offsets, ds.offsets)


def test_auto_falls_back_to_the_object_store_in_one_line_and_path_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ds = _on_disk(tmp_path)
    blind = {"10.0.0.3": f"{tmp_path / 'x.npy'} cannot be read (No such file or directory)"}
    monkeypatch.setattr(data_ship, "unreadable", lambda files: blind)
    with caplog.at_level(logging.INFO, logger=data_ship.__name__):
        assert data_ship.ship(ds, "auto") is ds
    (record,) = caplog.records
    assert "object store" in record.getMessage() and "10.0.0.3" in record.getMessage()
    with pytest.raises(ConfigError, match=r"data\.ship: .*Ray node 10\.0\.0\.3: .*x\.npy cannot be read") as err:
        data_ship.ship(ds, "path")
    assert "\n" not in str(err.value)
    monkeypatch.setattr(data_ship, "unreadable", lambda files: {})
    assert data_ship.ship(ds, "auto").x.base.by_path  # type: ignore[union-attr]
    assert data_ship.ship(ds, "object_store") is ds


def test_data_in_memory_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(files: object) -> dict[str, str]:
        raise AssertionError("no probe for data without memory maps")

    monkeypatch.setattr(data_ship, "unreadable", never)
    ds = FederatedDataset("m", "features", 2, np.zeros((4, 3), np.float32), np.zeros(4, np.int64),
                          np.array([0, 2, 4]), np.zeros((1, 3), np.float32), np.zeros(1, np.int64))  # fmt: skip
    assert data_ship.ship(ds, "path") is ds
