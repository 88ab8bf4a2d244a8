"""Records of tiny synthetic runs, pinned before the memory and start-up work (issue 13) changed how data is held,
how shards reduce and how runs start: every deterministic field of every round record, the final parameters (bytes)
and the trivial baseline must stay bit-identical. The digests were computed on commit b27ae4b with the same code as
``benchmarks/records_digest.py`` (which compares shipped experiments the same way). HeteroFL on Dirichlet data with
batch norm reads the images through the static-BN pass (fancy indexing of on-demand images) as well as per client.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import pytest

from rayfl.config import (
    BackendConfig,
    CNNConfig,
    DataConfig,
    ExperimentConfig,
    FedAvgConfig,
    HeteroFLConfig,
    TrainConfig,
)
from rayfl.engine.driver import RunResult, run_experiment

WALL_FIELDS = {"wall_time_s", "round_wall_s", "train_wall_s", "eval_wall_s", "search_s", "server_train_s", "hit_rate"}
# columns added after the pin (issue 12: dead actors, the non-finite guard, checkpoints), with their value in these
# runs (no faults, no roll-back, no checkpoint: the runs are not written)
LATER_FIELDS = {"faults": 0, "rolled_back": 0, "checkpoint_bytes": 0}
LATER_NAN_FIELDS = {"checkpoint_s"}
# issue 14's training MACs per round (3 x forward MACs x samples): a new figure, checked in tests/unit/system
LATER_FIGURES = {"train_macs"}

PINNED = {
    "fedavg_iid": ("b2ba2b8d4356c954", "7fc860c300e8b548", 0.093),
    "heterofl_dirichlet": ("5b2e9a02dc9f5f59", "10ce1ac0f17fb695", 0.114),
}


def _config(name: str) -> ExperimentConfig:
    if name == "fedavg_iid":
        algorithm: FedAvgConfig | HeteroFLConfig = FedAvgConfig()
        data = DataConfig(name="synthetic", partition="iid", num_clients=12, synthetic_samples=10)
        model = CNNConfig(channels=(4, 8))
    else:
        algorithm = HeteroFLConfig()
        data = DataConfig(
            name="synthetic",
            partition="dirichlet",
            dirichlet_alpha=0.5,
            num_clients=12,
            synthetic_samples=10,
            synthetic_noise=0.3,
        )
        model = CNNConfig(channels=(4, 8), norm="batch")
    return ExperimentConfig(
        name=name,
        rounds=2,
        clients_per_round=4,
        eval_every=1,
        data=data,
        model=model,
        algorithm=algorithm,
        train=TrainConfig(lr=0.05, batch_size=5, eval_batch_size=250),
        backend=BackendConfig(kind="local", num_hosts=2),
    )


def _digests(result: RunResult) -> tuple[str, str, float]:
    skip = WALL_FIELDS | set(LATER_FIELDS) | LATER_NAN_FIELDS | LATER_FIGURES
    rounds = [
        [(f.name, getattr(r, f.name)) for f in dataclasses.fields(r) if f.name not in skip] for r in result.records
    ]
    params = hashlib.sha256()
    for name in sorted(result.state.params):
        params.update(name.encode())
        params.update(result.state.params[name].detach().contiguous().numpy().tobytes())
    return hashlib.sha256(repr(rounds).encode()).hexdigest()[:16], params.hexdigest()[:16], result.baseline_acc


@pytest.mark.parametrize("name", sorted(PINNED))
def test_tiny_synthetic_runs_keep_their_records(name: str) -> None:
    result = run_experiment(_config(name), write=False)
    assert _digests(result) == PINNED[name]
    for record in result.records:
        assert {k: getattr(record, k) for k in LATER_FIELDS} == LATER_FIELDS
        assert all(math.isnan(getattr(record, k)) for k in LATER_NAN_FIELDS)
