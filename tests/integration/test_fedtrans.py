"""FedTrans runs, whose models are added between rounds, give the same numbers bit for bit in-process and on Ray, with
1 or 3 hosts and 1 or 4 parameter-server shards; records and the summary carry the family it grew."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rayfl.config.model import CellNetConfig
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.fl.methods.fedtrans.config import FedTransConfig
from rayfl.report import report
from tests.helpers import tiny_config
from tests.integration.test_multi_model import split_test_dataset

# models are added after rounds 0 and 1 (forced) and whenever the DoC allows it; 3 rounds in all
_ALGORITHM = FedTransConfig(force_rounds=(0, 1), alpha=0.5, gamma=1, doc_step=1)


def _run(kind: str, hosts: int, shards: int, output_dir: Path | None = None) -> RunResult:
    cfg = tiny_config(kind=kind, num_hosts=hosts, num_shards=shards, cpus_per_host=0.25)
    cfg = dataclasses.replace(
        cfg, model=CellNetConfig(channels=(4, 8)), algorithm=_ALGORITHM, output_dir=str(output_dir or "runs")
    )
    return run_experiment(cfg, write=output_dir is not None, dataset=split_test_dataset())


def _metrics(result: RunResult) -> list[tuple[object, ...]]:
    keys = ("train_loss", "test_acc", "model_accs", "clients_per_model", "client_acc", "train_macs", "bytes_up")
    return [tuple(getattr(r, k) for k in keys) for r in result.records]


def _assert_identical(a: RunResult, b: RunResult) -> None:
    assert _metrics(a) == _metrics(b)
    assert a.state.models == b.state.models
    assert a.state.params.keys() == b.state.params.keys()
    for name in a.state.params:
        assert torch.equal(a.state.params[name], b.state.params[name]), name
    assert (a.state.algo_state.utilities == b.state.algo_state.utilities).all()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def local_run() -> RunResult:
    return _run("local", 1, 1)


def test_models_are_added_during_the_run_and_recorded(local_run: RunResult, tmp_path: Path) -> None:
    models = local_run.state.models
    assert len(models) >= 3
    logs = [m.transforms for m in models]  # type: ignore[union-attr]
    assert all(logs[k][: len(logs[k - 1])] == logs[k - 1] and len(logs[k]) > len(logs[k - 1]) for k in range(1, 3))
    assert [r.num_models for r in local_run.records][:2] == [2, 3]
    trained = np.sum([[int(c) for c in r.clients_per_model.split()] for r in local_run.records[1:]], axis=0)
    assert trained[1] > 0 and trained[2] > 0  # grown models were trained: the equivalences below cover them
    for record in local_run.records:
        assert sum(int(c) for c in record.clients_per_model.split()) == record.clients_run - record.clients_failed
        assert 0.0 <= record.client_acc <= 1.0 and record.train_macs > 0
    written = _run("local", 1, 1, tmp_path)
    assert written.run_dir is not None
    summary = json.loads((written.run_dir / "summary.json").read_text())
    assert summary["fedtrans"]["models"] == [list(t) for t in logs]
    assert [t["child"] for t in summary["fedtrans"]["transformations"]] == list(range(1, len(models)))
    rows = (written.run_dir / "client_accs.csv").read_text().splitlines()
    assert rows[0] == "round_idx,client_id,model_id,evaluation,test_acc,num_test" and len(rows) == 1 + 3 * 12
    markdown, pngs = report([written.run_dir], tmp_path / "report")
    assert "## Client accuracy and training cost (paper 002)" in markdown
    assert (tmp_path / "report" / "client_accuracy.png") in pngs
    cost_row = next(line for line in markdown.splitlines() if line.startswith("| tiny |") and "%" in line)
    assert f"| {len(models)} |" in cost_row


def test_hosts_and_shards_do_not_change_results(local_run: RunResult) -> None:
    _assert_identical(local_run, _run("local", 3, 1))
    _assert_identical(local_run, _run("local", 1, 4))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_ray_equals_in_process(local_run: RunResult) -> None:
    _assert_identical(local_run, _run("ray", 1, 1))
    _assert_identical(
        local_run, _run("ray", 3, 4)
    )  # with the test above: 1 vs 3 hosts and 1 vs 4 shards, both backends
