"""Tabular data as a first-class input (issue 44, item 1): a Parquet file of 16 float columns, an integer label and a
``user`` column trains ``model.name: mlp`` without ``input_shape`` or a hand-written column list, on its natural
clients (``num_clients: 0``: every user) and split by a partitioner (the user column then ignored, never a feature);
``rayfl validate`` reads the file's metadata and refuses what the run would, in one line. Real files, real torch."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from torch import nn

from rayfl.cli import main
from rayfl.config.model import MLPConfig
from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.data import build_federated_dataset
from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from rayfl.models.elastic.cost import CostModel
from rayfl.models.elastic.mlp import MLPFamily
from rayfl.models.inputs import InputSpec, to_input

ROWS, FEATURES, CLASSES, USERS = 480, 16, 3, 6
MIB = 2.0**20


def _write_table(folder: Path) -> dict[str, np.ndarray]:
    """16 float features on different scales, a label they decide (linearly), a string user id per row."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(ROWS, FEATURES)) * np.arange(1, FEATURES + 1) + 10.0).astype(np.float32)
    y = np.argmax((x - 10.0) / np.arange(1, FEATURES + 1) @ rng.normal(size=(FEATURES, CLASSES)), axis=1)
    users = np.array([f"user{u}" for u in rng.integers(0, USERS, size=ROWS)])
    columns = {f"f{i}": x[:, i] for i in range(FEATURES)} | {"label": y.astype(np.int64), "user": users}
    pq.write_table(pa.table(columns), folder / "table.parquet")
    return {"x": x, "y": y, "users": users}


def _experiment(folder: Path, hidden: tuple[int, ...] = (32, 32)) -> Path:
    """The user's file: natural clients by ``user``, every one of them, an MLP, HeteroFL, memory budgets of two levels
    (the full model's need, and a half-width model's, which the full model does not fit)."""
    cost = CostModel(MLPFamily(MLPConfig(hidden=hidden), (FEATURES,), CLASSES), batch_size=8, momentum=0.0)
    full, half = (float(cost.evaluate_ratios(np.full((1, len(hidden)), r)).peak_memory[0]) / MIB for r in (1.0, 0.5))
    path = folder / "tabular.yaml"
    path.write_text(
        "name: tabular\nrounds: 2\nclients_per_round: 4\noutput_dir: runs\n"
        "data: {name: parquet, path: table.parquet, partition: natural, client_column: user, num_clients: 0, "
        "min_samples: 1}\n"
        f"model: {{name: mlp, hidden: {list(hidden)}}}\n"
        "algorithm: {name: heterofl}\n"
        f"system: {{memory: {{source: levels, values: [{full * 1.001}, {half * 1.001}]}}}}\n"
        "train: {lr: 0.05, batch_size: 8}\nbackend: {kind: local, num_hosts: 1}\n",
        encoding="utf-8",
    )
    return path


def _one_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    """Run the CLI, expect exit code 2, return its one stderr line."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rayfl: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_the_users_walk_trains_an_mlp_on_natural_then_dirichlet_clients(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _write_table(tmp_path)
    config = _experiment(tmp_path)
    assert main(["validate", str(config)]) == 0
    assert "OK (tabular: heterofl, mlp, parquet)" in capsys.readouterr().out

    # natural: one client per user, all of them (num_clients 0), the 16 floats a normalised feature vector
    cfg = load_config(config)
    ds = build_federated_dataset(cfg.data, cfg.seed)
    assert ds.input_kind == "features" and ds.sample_shape == (FEATURES,) and ds.x.dtype == np.float32
    assert sorted(ds.client_names) == sorted(set(rows["users"].tolist())) and ds.num_clients == USERS
    assert ds.meta["columns"] == [f"f{i}" for i in range(FEATURES)]  # the user column is no feature
    assert np.allclose(ds.meta["mean"], rows["x"].mean(axis=0), rtol=0.05)  # type: ignore[arg-type]
    z = to_input(np.asarray(ds.x), InputSpec.of(ds.input_kind, ds.num_classes, ds.x, ds.meta)).double()
    assert z.mean(dim=0).abs().max() < 1e-5 and (z.std(dim=0, unbiased=False) - 1).abs().max() < 1e-5
    natural = run_experiment(cfg, write=False)
    assert all(r.clients_run == 4 and r.clients_failed == 0 for r in natural.records)
    # each level's clients trained the model its budget was made for: the full MLP, or HeteroFL's half-width one
    assert all(r.memory_util == pytest.approx(1 / 1.001) for r in natural.records)
    assert natural.model_finite and math.isfinite(natural.records[-1].train_loss)

    # the same file split by a partitioner: the client column stays in the config, ignored, and is still no feature
    split = ["data.partition=dirichlet", "data.num_clients=4", "algorithm.name=model_search", "model.residual=true",
             "model.hidden=[32,16,16]", "algorithm.ratios=[0,0.5,1]", "system.memory.source=none"]  # fmt: skip
    assert main(["validate", str(config), *split]) == 0
    cfg = load_config(config, split)
    ds = build_federated_dataset(cfg.data, cfg.seed)
    assert ds.num_clients == 4 and ds.sample_shape == (FEATURES,) and cfg.data.client_column == "user"
    searched = run_experiment(cfg, write=False)
    assert all(r.clients_failed == 0 for r in searched.records) and searched.model_finite
    assert searched.records[-1].distinct_structures >= 1


@pytest.mark.parametrize(
    ("method", "failed"),
    [("fedrolex", 0), ("anycostfl", 0), ("feddropout", 0), ("fjord", 0), ("model_search", 0), ("fedavg", 2)],
)
def test_every_width_method_cuts_the_mlp_to_the_clients_budgets(tmp_path: Path, method: str, failed: int) -> None:
    """Half the clients have the memory of a half-width MLP: the width methods give them a sub-model that fits (no
    failure), while FedAvg's one full model fails them (the budgets bind)."""
    _write_table(tmp_path)
    result = run_experiment(load_config(_experiment(tmp_path), [f"algorithm.name={method}", "rounds=1"]), write=False)
    record = result.records[-1]
    assert (record.clients_run, record.clients_failed) == (4 - failed, failed) and result.model_finite


def test_validate_refuses_a_custom_model_whose_output_does_not_fit_the_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_table(tmp_path)
    config = str(_experiment(tmp_path))
    custom = ["algorithm.name=fedavg", "model.name=custom", "system.memory.source=none"]
    err = _one_line(capsys, ["validate", config, *custom, f"model.factory={__name__}:five_logits"])
    assert "model.factory: " in err and "forward returned torch.float32 (2, 5), expected floating-point logits of " \
        "shape (2, 3)" in err  # fmt: skip
    assert main(["validate", config, *custom, f"model.factory={__name__}:fitting"]) == 0


def test_validate_refuses_unusable_columns_and_models_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_table(tmp_path)
    config = str(_experiment(tmp_path))
    table = tmp_path / "table.parquet"
    err = _one_line(capsys, ["validate", config, "data.input_columns=[f0,user]"])
    assert f"{table}: data.input_columns: samples from columns ['f0', 'user']: column 'user' holds string values" in err
    err = _one_line(capsys, ["validate", config, "data.input_columns=[f0,age]"])
    assert "data.input_columns: no column 'age' (columns: f0, f1," in err
    err = _one_line(capsys, ["validate", config, "model.name=cnn"])
    assert "override 'model.name=cnn': model.name: model 'cnn' reads image inputs but data 'parquet' gives " \
        "features (a vector of numbers per sample): set model.name=mlp" in err  # fmt: skip
    err = _one_line(capsys, ["validate", config, "data.input_shape=[3,2,2]"])
    assert "data.input_shape: [3, 2, 2] holds 12 values, but a sample of ['f0', 'f1', 'f2', ..., 'f15'] (16 " \
        "columns) holds 16" in err  # fmt: skip
    err = _one_line(capsys, ["validate", config, "data.partition=iid", "data.num_clients=0"])
    assert "override 'data.num_clients=0': data.num_clients: 0 keeps every client of a natural partition" in err
    err = _one_line(capsys, ["validate", config, "data.partition=iid", "data.num_clients=500"])
    assert "data.num_clients: 500 clients cannot each get one of the 432 training rows" in err
    # a bare ``data.client_column=`` is no client column: the natural split then says what it needs
    err = _one_line(capsys, ["validate", config, "data.client_column="])
    assert "data.partition: 'natural' needs data.client_column" in err
    assert main(["validate", config, "data.client_column=", "data.partition=iid", "data.num_clients=4"]) == 0


def test_a_csv_file_gives_the_same_clients_as_the_parquet_file(tmp_path: Path) -> None:
    _write_table(tmp_path)
    pacsv.write_csv(pq.read_table(tmp_path / "table.parquet"), tmp_path / "table.csv")

    def data(name: str, **kw: object) -> DataConfig:
        base = {"name": "parquet", "client_column": "user", "num_clients": 0, "min_samples": 1}
        return DataConfig(path=str(tmp_path / name), **base, **kw)  # type: ignore[arg-type]

    ref = build_federated_dataset(data("table.parquet"), 0)
    csv = build_federated_dataset(data("table.csv"), 0)
    assert csv.input_kind == "features" and list(csv.client_names) == list(ref.client_names)
    assert np.array_equal(csv.offsets, ref.offsets) and np.allclose(np.asarray(csv.x), np.asarray(ref.x))
    with pytest.raises(ConfigError, match=r"table\.csv: data\.input_columns: no column 'age'"):
        build_federated_dataset(data("table.csv", input_columns=("age",)), 0)


def five_logits(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A custom model whose head was written for another data set (5 classes, whatever the data has)."""
    return nn.Sequential(nn.Linear(input_shape[0], 8), nn.ReLU(), nn.Linear(8, 5))


def fitting(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(input_shape[0], 8), nn.ReLU(), nn.Linear(8, num_classes))
