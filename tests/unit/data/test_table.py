"""Tables in (issue 29, Build 3): ``data.name: parquet`` (Parquet and Arrow files and folders) and ``data.name: hf``
(Hugging Face ``datasets``), every partitioner, reproducibility, and one-line errors naming the key and the file.
The files are made here, small."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.data import build_federated_dataset
from rayfl.experiment.loader import load_config

N = 240


def _rows(n: int = N, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` rows: 1x4x4 uint8 pixels, a label in 0-3, a client id (strings, interleaved), 6-token sequences."""
    rng = np.random.default_rng(seed)
    return {
        "pixels": rng.integers(0, 256, size=(n, 16)).astype(np.uint8),
        "label": rng.integers(0, 4, size=n).astype(np.int64),
        "user": np.array([f"user{u}" for u in rng.integers(0, 9, size=n)]),
        "tokens": rng.integers(0, 50, size=(n, 6)).astype(np.int32),
    }


def _table(rows: dict[str, np.ndarray], lo: int = 0, hi: int | None = None) -> pa.Table:
    hi = len(rows["label"]) if hi is None else hi
    return pa.table({
        "pixels": pa.array(list(rows["pixels"][lo:hi]), type=pa.list_(pa.uint8())),
        "label": rows["label"][lo:hi],
        "user": rows["user"][lo:hi],
        "tokens": pa.array(list(rows["tokens"][lo:hi]), type=pa.list_(pa.int32())),
    })  # fmt: skip


def _cfg(**kw: object) -> DataConfig:
    base: dict[str, object] = {"name": "parquet", "input_columns": ("pixels",), "input_shape": (1, 4, 4),
                               "num_clients": 6, "partition": "iid"}  # fmt: skip
    return DataConfig(**{**base, **kw})  # type: ignore[arg-type]


def _train_rows(ds: object) -> np.ndarray:
    return np.asarray(ds.x)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------------------------- Parquet
def test_parquet_folder_natural_clients_by_column(tmp_path: Path) -> None:
    rows = _rows()
    folder = tmp_path / "train"
    folder.mkdir()
    pq.write_table(_table(rows, 0, 100), folder / "part-0.parquet")
    pq.write_table(_table(rows, 100), folder / "part-1.parquet")
    test_rows = _rows(40, seed=1)
    pq.write_table(_table(test_rows), tmp_path / "test.parquet")
    sizes = {u: int(np.sum(rows["user"] == u)) for u in np.unique(rows["user"])}
    cut = sorted(sizes.values())[2]  # drops the users below the third-smallest size
    ds = build_federated_dataset(
        _cfg(path=str(folder), test_path=str(tmp_path / "test.parquet"), partition="natural", client_column="user",
             min_samples=cut, num_clients=100), seed=0)  # fmt: skip
    _, first = np.unique(rows["user"], return_index=True)
    appearance = [str(u) for u in rows["user"][np.sort(first)]]
    kept = [u for u in appearance if sizes[u] >= cut]
    assert list(ds.client_names) == kept and ds.input_kind == "image" and ds.sample_shape == (1, 4, 4)
    for c, user in enumerate(kept):
        x, y = ds.client_train(c)
        mine = np.flatnonzero(rows["user"] == user)  # its rows in file order
        assert np.array_equal(x.reshape(len(x), -1), rows["pixels"][mine]) and np.array_equal(y, rows["label"][mine])
    assert np.array_equal(np.asarray(ds.x_test).reshape(40, -1), test_rows["pixels"])
    assert np.array_equal(ds.y_test, test_rows["label"]) and ds.num_classes == 4
    assert ds.meta["partition"] == "natural" and len(ds.meta["mean"]) == 1  # type: ignore[arg-type]


def test_parquet_tokens_hold_out_test_fraction_reproducibly(tmp_path: Path) -> None:
    rows = _rows()
    pq.write_table(_table(rows), tmp_path / "all.parquet")
    cfg = _cfg(path=str(tmp_path / "all.parquet"), input_columns=("tokens",), input_shape=(), test_fraction=0.25)
    ds = build_federated_dataset(cfg, seed=3)
    assert ds.input_kind == "tokens" and ds.x.dtype == np.int64 and ds.sample_shape == (6,)
    assert len(ds.y_test) == 60 and ds.num_clients == 6 and int(ds.client_sizes().sum()) == 180
    every = np.concatenate([_train_rows(ds), np.asarray(ds.x_test)])  # train and test: every row once
    assert sorted(map(tuple, every.tolist())) == sorted(map(tuple, rows["tokens"].astype(np.int64).tolist()))
    again, other = build_federated_dataset(cfg, seed=3), build_federated_dataset(cfg, seed=4)
    assert np.array_equal(_train_rows(again), _train_rows(ds)) and np.array_equal(again.offsets, ds.offsets)
    assert not np.array_equal(_train_rows(other), _train_rows(ds))


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards", "pathological", "size_skew"])
def test_every_partitioner_splits_a_table(tmp_path: Path, kind: str) -> None:
    rows = _rows()
    pq.write_table(_table(rows), tmp_path / "all.parquet")
    ds = build_federated_dataset(_cfg(path=str(tmp_path / "all.parquet"), partition=kind, classes_per_client=2), 0)
    assert ds.num_clients == 6 and ds.meta["partition"] == kind and min(ds.client_sizes()) >= 1
    if kind == "pathological":
        assert all(len(ds.client_labels(c)) == 2 for c in range(6))
    if kind != "pathological":  # the others keep every training row
        assert int(ds.client_sizes().sum()) == N - len(ds.y_test)


def test_arrow_file_is_memory_mapped_and_scalar_columns_stack(tmp_path: Path) -> None:
    rows = _rows()
    flat = pa.array(rows["pixels"].astype(np.float32).reshape(-1))
    table = pa.table({"img": pa.FixedSizeListArray.from_arrays(flat, 16), "label": rows["label"]})
    with pa.OSFile(str(tmp_path / "d.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    ds = build_federated_dataset(_cfg(path=str(tmp_path / "d.arrow"), input_columns=()), 0)
    base = ds.x.base  # type: ignore[union-attr]
    assert base.dtype == np.float32 and not base.flags.owndata and not base.flags.writeable  # the mapped pages
    assert np.array_equal(np.sort(base.reshape(N, -1), axis=0), np.sort(rows["pixels"].astype(np.float32), axis=0))
    columns = {f"p{i}": rows["pixels"][:, i] for i in range(16)} | {"label": rows["label"]}
    pq.write_table(pa.table(columns), tmp_path / "wide.parquet")
    wide = build_federated_dataset(_cfg(path=str(tmp_path / "wide.parquet"), input_columns=()), 0)
    assert wide.x.dtype == np.uint8 and np.array_equal(np.asarray(wide.x), np.asarray(ds.x).astype(np.uint8))


def test_string_labels_are_numbered_in_sorted_order(tmp_path: Path) -> None:
    rows = _rows()
    names = np.array(["cat", "ant", "dog", "bee"])
    table = _table(rows).set_column(1, "label", pa.array(names[rows["label"]]))
    pq.write_table(table, tmp_path / "s.parquet")
    ds = build_federated_dataset(_cfg(path=str(tmp_path / "s.parquet")), 0)
    assert ds.meta["classes"] == ["ant", "bee", "cat", "dog"]
    expected = build_federated_dataset(_cfg(path=str(tmp_path / "s.parquet")), 0)
    numbered = np.searchsorted(np.array(["ant", "bee", "cat", "dog"]), names)  # label id -> its name's position
    pq.write_table(_table(rows).set_column(1, "label", pa.array(numbered[rows["label"]])), tmp_path / "n.parquet")
    same = build_federated_dataset(_cfg(path=str(tmp_path / "n.parquet")), 0)
    assert np.array_equal(same.y, expected.y) and np.array_equal(same.y_test, ds.y_test)


# ------------------------------------------------------------------------------------------ Hugging Face
def test_hf_save_to_disk_splits_match_the_same_rows_as_parquet(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows, test_rows = _rows(), _rows(40, seed=1)

    def hf(r: dict[str, np.ndarray]) -> object:
        features = datasets.Features({
            "pixels": datasets.Sequence(datasets.Value("uint8")),
            "label": datasets.ClassLabel(num_classes=4),
            "user": datasets.Value("string"),
            "tokens": datasets.Sequence(datasets.Value("int32")),
        })  # fmt: skip
        return datasets.Dataset.from_dict({k: v.tolist() for k, v in r.items()}, features=features)

    datasets.DatasetDict({"train": hf(rows), "test": hf(test_rows)}).save_to_disk(str(tmp_path / "hf"))
    pq.write_table(_table(rows), tmp_path / "train.parquet")
    pq.write_table(_table(test_rows), tmp_path / "test.parquet")
    ds = build_federated_dataset(_cfg(name="hf", path=str(tmp_path / "hf"), partition="dirichlet"), 0)
    ref = build_federated_dataset(_cfg(path=str(tmp_path / "train.parquet"), test_path=str(tmp_path / "test.parquet"),
                                       partition="dirichlet"), 0)  # fmt: skip
    assert ds.name == "hf" and np.array_equal(ds.offsets, ref.offsets)
    assert np.array_equal(np.asarray(ds.x), np.asarray(ref.x)) and np.array_equal(ds.y, ref.y)
    assert np.array_equal(ds.y_test, ref.y_test)
    with pytest.raises(ConfigError, match=r"^.*hf: data\.split: has no split 'validation' \(splits: train, test\)$"):
        build_federated_dataset(_cfg(name="hf", path=str(tmp_path / "hf"), split="validation"), 0)


def test_hf_fixed_shape_arrays_are_read_as_their_nested_lists(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = _rows()
    images = rows["pixels"].reshape(N, 1, 4, 4)
    array = datasets.Array3D(shape=(1, 4, 4), dtype="uint8")
    features = datasets.Features({"x": array, "label": datasets.Value("int64")})
    datasets.Dataset.from_dict({"x": list(images), "label": rows["label"].tolist()}, features=features).save_to_disk(
        str(tmp_path / "arr"))
    ds = build_federated_dataset(_cfg(name="hf", path=str(tmp_path / "arr"), input_columns=(), input_shape=()), 0)
    assert ds.input_kind == "image" and ds.sample_shape == (1, 4, 4)
    every = np.concatenate([np.asarray(ds.x), np.asarray(ds.x_test)])
    assert sorted(map(bytes, every)) == sorted(map(bytes, images))


def test_hf_single_dataset_holds_out_test_fraction(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = _rows()
    datasets.Dataset.from_dict({k: v.tolist() for k, v in rows.items()}).save_to_disk(str(tmp_path / "one"))
    ds = build_federated_dataset(
        _cfg(name="hf", path=str(tmp_path / "one"), input_columns=("tokens",), input_shape=(), partition="natural",
             client_column="user", min_samples=1, num_clients=100, test_fraction=0.5), 0)  # fmt: skip
    assert ds.input_kind == "tokens" and len(ds.y_test) == N // 2 and int(ds.client_sizes().sum()) == N // 2
    assert set(ds.client_names) == set(np.unique(rows["user"]).tolist())


# ------------------------------------------------------------------------------------------ encoded images
def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def test_png_bytes_are_decoded_when_read(tmp_path: Path) -> None:
    """A binary column of PNGs (a Parquet export of an image data set): the rows decode, lossless, to the pixels;
    set-up decodes only the first image and the statistics' sample, and the clients' rows stay encoded."""
    import pickle

    rows = _rows()
    pixels = rows["pixels"].reshape(N, 4, 4)
    table = pa.table({"png": pa.array([_png(p) for p in pixels], pa.binary()), "label": rows["label"]})
    pq.write_table(table, tmp_path / "png.parquet")
    ds = build_federated_dataset(_cfg(path=str(tmp_path / "png.parquet"), input_columns=("png",), input_shape=()), 0)
    assert ds.input_kind == "image" and ds.sample_shape == (1, 4, 4) and ds.x.dtype == np.uint8
    reference = build_federated_dataset(_cfg(path=str(tmp_path / "png.parquet"), input_columns=("png",),
                                              input_shape=()), 0)  # fmt: skip
    assert np.array_equal(ds.offsets, reference.offsets)
    by_row = {tuple(p.reshape(-1).tolist()): i for i, p in enumerate(pixels)}  # decoded rows are the written ones
    decoded = np.asarray(ds.x).reshape(len(ds.y), -1)
    assert all(rows["label"][by_row[tuple(r.tolist())]] == y for r, y in zip(decoded, ds.y, strict=True))
    assert len(pickle.dumps(ds.x)) < 2 * len(pickle.dumps(table.column("png").combine_chunks().buffers()[2]))
    big = pa.table({"png": pa.array([_png(np.zeros((5, 4), np.uint8))] + [_png(p) for p in pixels[1:]]),
                    "label": rows["label"]})  # fmt: skip
    assert "column 'png': image 1 is 4x4, the first 4x5 (239 differ): every image needs one size" in _error(
        tmp_path, big, input_columns=("png",), input_shape=())
    by_path = pa.table({"img": pa.array([{"bytes": None, "path": "a.png"}] * N,
                                        pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        "label": rows["label"]})  # fmt: skip
    assert "240 image(s) without bytes (images stored by path" in _error(tmp_path, by_path, input_columns=("img",))


def test_a_hugging_face_image_column_is_decoded(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    colour = rng.integers(0, 256, size=(60, 6, 5, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, size=60)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=3)})
    datasets.Dataset.from_dict({"image": list(colour), "label": labels.tolist()}, features=features).save_to_disk(
        str(tmp_path / "img"))
    ds = build_federated_dataset(_cfg(name="hf", path=str(tmp_path / "img"), input_columns=(), input_shape=(),
                                      num_clients=3, test_fraction=0.2), 0)  # fmt: skip
    assert ds.input_kind == "image" and ds.sample_shape == (3, 6, 5) and len(ds.y_test) == 12
    every = np.concatenate([np.asarray(ds.x), np.asarray(ds.x_test)]).transpose(0, 2, 3, 1)
    assert sorted(map(bytes, every)) == sorted(map(bytes, colour))  # lossless, channels first
    assert len(ds.meta["mean"]) == 3  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ errors
def _error(tmp_path: Path, table: pa.Table, **kw: object) -> str:
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    with pytest.raises(ConfigError) as caught:
        build_federated_dataset(_cfg(path=str(path), **kw), 0)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{path}: data.")
    return text


def test_bad_tables_are_one_line_naming_the_key_and_file(tmp_path: Path) -> None:
    rows = _rows()
    good = _table(rows)
    assert "data.label_column: no column 'y' (columns: pixels, label, user, tokens)" in _error(
        tmp_path, good, label_column="y")
    assert "data.input_columns: no column 'image'" in _error(tmp_path, good, input_columns=("image",))
    assert "data.client_column: no column 'client'" in _error(
        tmp_path, good, partition="natural", client_column="client")
    ragged = good.set_column(0, "pixels", pa.array([list(range(16 - i % 2)) for i in range(N)], pa.list_(pa.uint8())))
    assert "holds lists of 15 to 16 values" in _error(tmp_path, ragged)
    named = good.select(["label", "user"])
    assert "samples from columns ['user'] (data.input_columns is empty" in _error(tmp_path, named, input_columns=())
    assert "column 'user' holds string values" in _error(tmp_path, named, input_columns=())
    assert "data.input_shape: [2, 4, 4] holds 32 values" in _error(tmp_path, good, input_shape=(2, 4, 4))
    assert "labels reach 3, outside [0, 3)" in _error(tmp_path, good, num_classes=3)
    floats = good.set_column(1, "label", pa.array(rows["label"].astype(np.float64)))
    assert "data.label_column: column 'label' holds double" in _error(tmp_path, floats)
    matrices = pa.table({"m": pa.array([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]] * N), "label": rows["label"]})
    assert "data.input_shape: samples of shape [2, 3]: set data.input_shape to [C, H, W] (images)" in _error(
        tmp_path, matrices, input_columns=(), input_shape=())
    images = pa.table({"img": pa.array([{"bytes": b"\x89PNG", "path": None}] * N), "label": rows["label"]})
    assert "column 'img': its first image cannot be decoded" in _error(tmp_path, images, input_columns=("img",))
    assert "encoded images are read as the only sample column" in _error(
        tmp_path, images.append_column("more", pa.array(np.ones(N))), input_columns=("img", "more"))
    assert "data.partition: classes_per_client must be in [1, 4]" in _error(
        tmp_path, good, partition="pathological", classes_per_client=5)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match=r"^\S+junk\.parquet: data\.path: cannot be read as a Parquet file \(.*\)$"):
        build_federated_dataset(_cfg(path=str(tmp_path / "junk.parquet")), 0)


def test_the_loader_refuses_what_cannot_be_split(tmp_path: Path) -> None:
    pq.write_table(_table(_rows()), tmp_path / "t.parquet")

    def refused(text: str) -> str:
        (tmp_path / "e.yaml").write_text(text)
        with pytest.raises(ConfigError) as caught:
            load_config(tmp_path / "e.yaml")
        return str(caught.value)

    data = json.dumps({"name": "parquet", "path": str(tmp_path / "t.parquet")})
    assert "data.partition: 'natural' needs data.client_column" in refused(f"data: {data}\n")
    assert "data.path: 'missing.parquet' does not exist" in refused("data: {name: parquet, path: missing.parquet}\n")
    assert "data.path: data 'parquet' needs" in refused("data: {name: parquet, partition: iid}\n")
    assert "data.partition: 'shards' splits centralised data" in refused(
        "data: {name: synthetic, partition: shards}\nmodel: {name: cnn}\n")
    ignored = json.dumps({"name": "parquet", "partition": "iid", "client_column": "user", "path": "t.parquet"})
    (tmp_path / "e.yaml").write_text(f"data: {ignored}\n")
    assert load_config(tmp_path / "e.yaml").data.client_column == "user"  # the partitioners ignore it (issue 44)


def test_hf_reads_a_local_data_set_folder_with_load_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder that is not a save_to_disk copy (here: train and test Parquet files, as a data set repository holds
    them) goes through load_dataset, offline, its cache in data.root; the same rows as reading the files directly."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # read at import: the environment is too late here
    rows, test_rows = _rows(), _rows(40, seed=1)
    (tmp_path / "repo" / "data").mkdir(parents=True)
    pq.write_table(_table(rows), tmp_path / "repo" / "data" / "train.parquet")
    pq.write_table(_table(test_rows), tmp_path / "repo" / "data" / "test.parquet")
    (tmp_path / "cache").mkdir()
    ds = build_federated_dataset(_cfg(name="hf", path=str(tmp_path / "repo"), root=str(tmp_path / "cache")), 0)
    ref = build_federated_dataset(_cfg(path=str(tmp_path / "repo" / "data" / "train.parquet"),
                                       test_path=str(tmp_path / "repo" / "data" / "test.parquet")), 0)  # fmt: skip
    assert np.array_equal(np.asarray(ds.x), np.asarray(ref.x)) and np.array_equal(ds.y_test, ref.y_test)
    with pytest.raises(ConfigError, match=r"^nobody/nothing: data\.hf_name: cannot be loaded as a Hugging Face data"):
        build_federated_dataset(_cfg(name="hf", hf_name="nobody/nothing", root=str(tmp_path / "cache")), 0)
