"""One end for every round policy (``engine/policies/round_end.py``), and the FedBuff / FedAsync rules as data
(``buffered.ServerRule``): sync, FedBuff and search-only rounds end through the same evaluation-and-record path, and
the two asynchronous rules give the module docstring's numbers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.config.sections import ServerConfig
from rayfl.core.messages import Assignment
from rayfl.data.federated import FederatedDataset
from rayfl.engine.driver import run_experiment
from rayfl.engine.exec.client_state import KeptUpload
from rayfl.engine.policies.buffered import BufferedRounds, Flight, ServerRule, fedasync, fedbuff
from rayfl.engine.search_only import run_search_only
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.registry import build_algorithm
from rayfl.system.clock import ClientPlan
from tests.helpers import tiny_config, tiny_image_dataset
from tests.resume_cases import WALL_CLOCK_COLUMNS

# the columns only a round whose clients trained fills (a search-only round leaves them NaN or 0): its loss, its
# evaluation, its learning rate, its training work, the staleness of the updates it applied (0 in a sync round)
TRAINED_ROUND_COLUMNS = ["train_loss", "test_acc", "test_loss", "device_acc", "lr", "train_macs"]
APPLIED_COLUMNS = ["staleness_mean", "staleness_max"]
# a client row's columns from its training: what its links delivered, its training work, its share of the aggregate
TRAINED_CLIENT_COLUMNS = ["p_down", "p_up", "train_macs", "agg_weight"]


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return tiny_image_dataset()


def _table(run_dir: Path | None, name: str, drop: list[str]) -> pd.DataFrame:
    assert run_dir is not None
    frame = pd.read_csv(run_dir / f"{name}.csv", keep_default_na=False, dtype={"units": str})
    return frame.drop(columns=[c for c in [*WALL_CLOCK_COLUMNS, *drop] if c in frame.columns])


def test_sync_fedbuff_and_search_only_rounds_end_with_the_same_rows(data: FederatedDataset, tmp_path: Path) -> None:
    """The same two rounds (FedAvg, training a no-op so that every plan is kept) run as sync rounds, as FedBuff steps
    with B = C = K and no staleness weight, and search-only: the three record them through one end, so ``rounds.csv``
    and ``clients.csv`` agree in every column but those only training fills, and there exactly as a planned round
    differs from a trained one (NaN loss, accuracy and rate, 0 work, no update applied)."""
    cfg = dataclasses.replace(tiny_config(kind="local"), rounds=2, output_dir=str(tmp_path))
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, noop=True))
    server = ServerConfig(policy="fedbuff", concurrency=5, buffer_size=5, staleness="none", refill="applied")

    def written(name: str, config: ExperimentConfig) -> Path | None:
        return run_experiment(dataclasses.replace(config, name=name), dataset=data).run_dir

    sync, buff = written("sync", cfg), written("fedbuff", dataclasses.replace(cfg, server=server))
    search = run_search_only(dataclasses.replace(cfg, name="search"), dataset=data).run_dir
    # sync and FedBuff: the same rows (their own policy columns aside)
    pd.testing.assert_frame_equal(
        _table(sync, "rounds", ["in_flight"]), _table(buff, "rounds", ["in_flight"]), check_exact=True
    )
    pd.testing.assert_frame_equal(
        _table(sync, "clients", ["agg_weight"]), _table(buff, "clients", ["agg_weight"]), check_exact=True
    )
    # search-only: the same rows but for what training fills
    drop = [*TRAINED_ROUND_COLUMNS, *APPLIED_COLUMNS, "checkpoint_bytes", "checkpoint_s"]
    pd.testing.assert_frame_equal(_table(sync, "rounds", drop), _table(search, "rounds", drop), check_exact=True)
    pd.testing.assert_frame_equal(
        _table(sync, "clients", TRAINED_CLIENT_COLUMNS),
        _table(search, "clients", TRAINED_CLIENT_COLUMNS),
        check_exact=True,
    )
    assert search is not None and sync is not None
    planned = pd.read_csv(search / "rounds.csv")
    trained = pd.read_csv(sync / "rounds.csv")
    assert planned[["train_loss", "test_acc", "lr", *APPLIED_COLUMNS]].isna().all().all()
    assert (planned["train_macs"] == 0).all() and trained["test_acc"].notna().all()
    assert (trained[APPLIED_COLUMNS] == 0).all().all()  # a sync round applies updates of staleness 0


def _flight(serial: int, start_version: int, values: list[float], base: list[float], weight: float) -> Flight:
    upload = KeptUpload({"w": np.array(values, dtype=np.float32)}, {}, weight, {})
    return Flight(
        serial=serial,
        client_id=serial,
        start_version=start_version,
        start_s=0.0,
        free_s=0.0,
        plan=ClientPlan.empty(start_version, 0.0),
        assignment=Assignment(),
        task=None,
        upload=upload,
        base={"w": np.array(base, dtype=np.float32)},
    )


def _step(rule: ServerRule, staleness_weights: list[float]) -> np.ndarray:
    """The aggregate at version 2 (p = [1, 2]) of two updates: client 0 started on version 0 (v = [3, 6], its start's
    values b = [0, 0], weight 1), client 1 on version 2 (v = [5, 4], b = p, weight 3)."""
    cfg = tiny_config()
    algorithm = build_algorithm(cfg.algorithm, cfg.train)
    current = {"w": torch.tensor([1.0, 2.0])}
    flights = [_flight(0, 0, [3.0, 6.0], [0.0, 0.0], 1.0), _flight(1, 2, [5.0, 4.0], [1.0, 2.0], 3.0)]
    policy = BufferedRounds(cfg, rule)
    state = algorithm.init_state(current)
    aggregate, _ = policy._aggregate(algorithm, state, 2, flights, np.array(staleness_weights))
    return aggregate.params["w"].numpy()


def test_fedbuff_takes_deltas_from_the_start_and_fedasync_mixes_into_the_current_model() -> None:
    """The module docstring's two rules in closed form, each update ``x`` then averaged with weights 1 and 3.
    FedBuff: x = p + s (v - b); FedAsync: x = p + mixing s (v - p)."""
    cfg = tiny_config()
    buff = fedbuff(cfg)
    # s = (0.5, 1): x0 = [1, 2] + 0.5 [3, 6] = [2.5, 5]; x1 = v1 (started on the current version) = [5, 4]
    np.testing.assert_allclose(_step(buff, [0.5, 1.0]), [(2.5 + 15) / 4, (5 + 12) / 4])
    # s = 1: client 0's delta from its start, [3, 6], lands on p: x0 = [4, 8]
    np.testing.assert_allclose(_step(buff, [1.0, 1.0]), [(4 + 15) / 4, (8 + 12) / 4])
    mixing = dataclasses.replace(cfg, server=ServerConfig(policy="fedasync", mixing=0.5))
    half = fedasync(mixing)
    assert half.buffer_size == 1 and not half.from_start
    # mixing 0.5, s = (0.5, 1): x0 = p + 0.25 (v0 - p) = [1.5, 3]; x1 = p + 0.5 (v1 - p) = [3, 3]
    np.testing.assert_allclose(_step(half, [0.5, 1.0]), [(1.5 + 9) / 4, (3 + 9) / 4])
    # mixing 1, s = 1: FedAsync takes each client's model as it is, whatever version it started on: x0 = v0
    whole = fedasync(dataclasses.replace(cfg, server=ServerConfig(policy="fedasync", mixing=1.0)))
    np.testing.assert_allclose(_step(whole, [1.0, 1.0]), [(3 + 15) / 4, (6 + 12) / 4])
