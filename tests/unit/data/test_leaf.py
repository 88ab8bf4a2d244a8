"""LEAF JSON folders (FEMNIST, Shakespeare): task detection, shapes, client order, test splits, filtering."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rayfl.config.sections import DataConfig
from rayfl.data import build_federated_dataset
from rayfl.data.leaf import load_leaf


def _write(path: Path, users: dict[str, tuple[list[object], list[object]]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "users": list(users),
        "num_samples": [len(x) for x, _ in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }
    path.write_text(json.dumps(doc), encoding="utf-8")


def _img(value: float) -> list[float]:
    return [value] * 784


def make_femnist(root: Path) -> None:
    # two train files; users in file-name order: f0001, f0002 (file a), f0003 (file b)
    _write(
        root / "train" / "all_data_0_train.json",
        {
            "f0001": ([_img(0.1), _img(0.2), _img(0.3)], [1, 2, 61]),
            "f0002": ([_img(0.5)], [7]),
        },
    )
    pixel = _img(0.0)
    pixel[2 * 28 + 3] = 0.75  # row 2, column 3
    _write(root / "train" / "all_data_1_train.json", {"f0003": ([pixel, _img(0.9)], [0, 5])})
    _write(
        root / "test" / "all_data_0_test.json",
        {"f0001": ([_img(0.4)], [3]), "ghost": ([_img(0.4)], [3])},  # 'ghost' has no training data
    )
    _write(root / "test" / "all_data_1_test.json", {"f0003": ([_img(0.6), _img(0.7)], [4, 4])})


def _window(ch: str) -> str:
    return (ch * 80)[:80]


def make_shakespeare(root: Path) -> None:
    _write(
        root / "train" / "train.json",
        {
            "THE_TEMPEST_PROSPERO": ([_window("a"), "To be, or not to be" + " " * 61], ["b", "!"]),
            "HAMLET_HAMLET": ([_window("Z"), _window("z"), _window("}")], ["\n", "q", "\u00e9"]),
        },
    )
    _write(root / "test" / "test.json", {"HAMLET_HAMLET": ([_window("x")], ["y"])})


def test_femnist(tmp_path: Path) -> None:
    make_femnist(tmp_path)
    cfg = DataConfig(name="leaf", num_clients=0, min_samples=1)
    ds = load_leaf(tmp_path, None, cfg, seed=0)
    assert ds.name == "femnist" and ds.input_kind == "image" and ds.num_classes == 62
    assert ds.client_names == ("f0001", "f0002", "f0003")
    assert ds.client_sizes().tolist() == [3, 1, 2]
    assert ds.x.shape == (6, 1, 28, 28) and ds.x.dtype == np.float32
    assert ds.y.dtype == np.int64 and ds.y.tolist() == [1, 2, 61, 7, 0, 5]
    assert ds.x[4, 0, 2, 3] == pytest.approx(0.75) and ds.x[4, 0, 2, 4] == 0.0
    # per-client test splits: f0002 has none, 'ghost' is not a client
    assert ds.test_offsets is not None and ds.test_offsets.tolist() == [0, 1, 1, 3]
    assert ds.client_test(0)[1].tolist() == [3]
    assert ds.client_test(1)[0].shape == (0, 1, 28, 28)
    assert ds.client_test(2)[1].tolist() == [4, 4]
    assert ds.x_test.shape == (3, 1, 28, 28)
    assert ds.meta["mean"] == [0.0] and ds.meta["std"] == [1.0]


def test_femnist_min_samples_and_client_subset(tmp_path: Path) -> None:
    make_femnist(tmp_path)
    ds = load_leaf(tmp_path, "femnist", DataConfig(name="leaf", num_clients=100, min_samples=2), seed=0)
    assert ds.client_names == ("f0001", "f0003")
    assert ds.test_offsets is not None and ds.test_offsets.tolist() == [0, 1, 3]
    picks = {
        load_leaf(tmp_path, None, DataConfig(name="leaf", num_clients=2, min_samples=1), s).client_names
        for s in range(20)
    }
    assert all(len(p) == 2 and list(p) == sorted(p) for p in picks)  # a subset, kept in file order
    assert len(picks) > 1  # and it depends on the seed
    with pytest.raises(ValueError, match="min_samples"):
        load_leaf(tmp_path, None, DataConfig(name="leaf", min_samples=10), seed=0)


def test_femnist_cap(tmp_path: Path) -> None:
    make_femnist(tmp_path)
    cfg = DataConfig(name="leaf", num_clients=0, min_samples=1, max_samples_per_client=1)
    ds = load_leaf(tmp_path, None, cfg, seed=0)
    assert ds.client_sizes().tolist() == [1, 1, 1]
    assert ds.test_offsets is not None and ds.test_offsets.tolist() == [
        0,
        1,
        1,
        3,
    ]  # test rows are not capped


def test_shakespeare(tmp_path: Path) -> None:
    from rayfl.data.shakespeare import OOV_INDEX, VOCAB

    make_shakespeare(tmp_path)
    ds = load_leaf(tmp_path, None, DataConfig(name="leaf", num_clients=0, min_samples=1), seed=0)
    assert ds.name == "shakespeare" and ds.input_kind == "tokens"
    assert ds.num_classes == len(VOCAB) + 1
    assert ds.client_names == ("THE_TEMPEST_PROSPERO", "HAMLET_HAMLET")
    assert ds.x.shape == (5, 80) and ds.x.dtype == np.uint8
    assert ds.x[0].tolist() == [VOCAB.index("a")] * 80
    assert "".join(VOCAB[t] for t in ds.x[1, :19]) == "To be, or not to be"
    assert ds.y.tolist() == [VOCAB.index(c) for c in "b!\nq"] + [OOV_INDEX]
    assert ds.test_offsets is not None and ds.test_offsets.tolist() == [0, 0, 1]
    assert ds.client_test(0)[0].shape == (0, 80)
    assert ds.client_test(1)[1].tolist() == [VOCAB.index("y")]
    assert ds.meta["seq_len"] == 80


def test_leaf_data_subfolder_and_dispatcher(tmp_path: Path) -> None:
    make_shakespeare(tmp_path / "data")  # LEAF's own layout: <task>/data/{train,test}
    cfg = DataConfig(name="leaf", root=str(tmp_path), num_clients=0, min_samples=3)
    ds = build_federated_dataset(cfg, seed=0)
    assert ds.client_names == ("HAMLET_HAMLET",)
    make_femnist(tmp_path / "cache" / "leaf")
    ds = build_federated_dataset(DataConfig(name="leaf", min_samples=1), seed=0, cache_dir=tmp_path / "cache")
    assert ds.name == "femnist"


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train"):
        load_leaf(tmp_path, None, DataConfig(name="leaf"), seed=0)
    make_femnist(tmp_path)
    with pytest.raises(ValueError, match="not shakespeare"):
        load_leaf(tmp_path, "shakespeare", DataConfig(name="leaf", min_samples=1), seed=0)
    with pytest.raises(ValueError, match="natural"):
        load_leaf(tmp_path, None, DataConfig(name="leaf", partition="iid", min_samples=1), seed=0)
    bad = tmp_path / "bad"
    _write(bad / "train" / "t.json", {"u": ([[1.0, 2.0]], [0])})
    _write(bad / "test" / "t.json", {"u": ([[1.0, 2.0]], [0])})
    with pytest.raises(ValueError, match="2 values"):
        load_leaf(bad, None, DataConfig(name="leaf", min_samples=1), seed=0)
