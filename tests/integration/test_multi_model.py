"""Several global models in one run: independent FedAvg models assigned by client id.

Same seed ⇒ the same numbers, bit for bit, in-process and on Ray, with 1 or 3 hosts and 1 or 4 parameter-server
shards; one model in the multi-model machinery equals plain FedAvg; records carry each client's model and each
model's accuracy and client count.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest
import torch

from rayfl.data.federated import FederatedDataset, from_client_arrays
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.fl.common.multimodel import model_params
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.independent.config import IndependentConfig
from tests.helpers import tiny_config, tiny_image_dataset


def split_test_dataset(num_clients: int = 12) -> FederatedDataset:
    """``tiny_image_dataset`` with the test set split by client (6 rows each), for the average client accuracy."""
    ds = tiny_image_dataset(num_clients=num_clients)
    train = [ds.client_train(c) for c in range(num_clients)]
    extra = tiny_image_dataset(num_clients=1, per_client=6 * num_clients, seed=1).client_train(0)
    test = [(extra[0][6 * c : 6 * c + 6], extra[1][6 * c : 6 * c + 6]) for c in range(num_clients)]
    return from_client_arrays("tiny", "image", 4, train, ds.x_test, ds.y_test, meta=ds.meta, test=test)


def _run(kind: str, hosts: int, shards: int, num_models: int = 2) -> RunResult:
    cfg = tiny_config(kind=kind, num_hosts=hosts, num_shards=shards, cpus_per_host=0.25)
    cfg = dataclasses.replace(cfg, algorithm=IndependentConfig(num_models=num_models))
    return run_experiment(cfg, write=False, dataset=split_test_dataset())


def _metrics(result: RunResult) -> list[tuple[object, ...]]:
    keys = ("train_loss", "test_acc", "test_loss", "bytes_down", "model_accs", "clients_per_model", "client_acc")
    return [tuple(getattr(r, k) for k in keys) for r in result.records]


def _assert_identical(a: RunResult, b: RunResult) -> None:
    assert _metrics(a) == _metrics(b)
    assert a.state.params.keys() == b.state.params.keys()
    for name in a.state.params:
        assert torch.equal(a.state.params[name], b.state.params[name]), name


def test_two_models_train_separately_and_are_recorded() -> None:
    result = _run("local", 1, 1)
    state = result.state
    assert len(state.models) == 2
    zero, one = model_params(state.params, 0), model_params(state.params, 1)
    assert zero.keys() == one.keys() and len(state.params) == 2 * len(zero)
    assert any(not torch.equal(zero[n], one[n]) for n in zero)
    for record in result.records:
        counts = [int(c) for c in record.clients_per_model.split()]
        assert record.num_models == 2 and sum(counts) == record.clients_run - record.clients_failed
        accs = [float(a) for a in record.model_accs.split()]
        assert len(accs) == 2 and accs[0] == record.test_acc
        assert 0.0 <= record.client_acc <= 1.0


def test_client_records_name_the_model_by_client_id(tmp_path: Path) -> None:
    cfg = tiny_config(kind="local", num_hosts=1)
    cfg = dataclasses.replace(cfg, algorithm=IndependentConfig(num_models=3), output_dir=str(tmp_path), rounds=2)
    result = run_experiment(cfg, write=True, dataset=split_test_dataset())
    assert result.run_dir is not None
    with (result.run_dir / "clients.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * cfg.clients_per_round
    assert [int(r["model_id"]) for r in rows] == [int(r["client_id"]) % 3 for r in rows]


def test_one_model_equals_fedavg() -> None:
    multi = _run("local", 1, 1, num_models=1)
    cfg = tiny_config(kind="local", num_hosts=1, num_shards=1, cpus_per_host=0.25)
    cfg = dataclasses.replace(cfg, algorithm=FedAvgConfig())
    plain = run_experiment(cfg, write=False, dataset=split_test_dataset())
    keys = ("train_loss", "test_acc", "test_loss", "bytes_down", "client_acc")
    assert [tuple(getattr(r, k) for k in keys) for r in multi.records] == [
        tuple(getattr(r, k) for k in keys) for r in plain.records
    ]
    for name, value in plain.state.params.items():
        assert torch.equal(multi.state.params[name], value), name


def test_hosts_and_shards_do_not_change_results() -> None:
    base = _run("local", 1, 1)
    _assert_identical(base, _run("local", 3, 1))
    _assert_identical(base, _run("local", 1, 4))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_ray_equals_in_process() -> None:
    local = _run("local", 1, 1)
    _assert_identical(local, _run("ray", 3, 4))
    _assert_identical(local, _run("ray", 1, 1))
