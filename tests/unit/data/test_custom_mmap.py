"""A custom data set's memory-mapped arrays stay memory maps, and train exactly as the same arrays in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
from rayfl.data import build_federated_dataset
from rayfl.data.federated import IndexedRows
from rayfl.engine.driver import run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.fedavg.config import FedAvgConfig


def arrays(folder: str, mmap: bool) -> dict[str, np.ndarray]:
    """The factory: 40 training and 10 test images saved as .npy in ``folder``, loaded mapped or into memory."""
    root = Path(folder)
    if not (root / "x.npy").exists():
        rng = np.random.default_rng(0)
        np.save(root / "x.npy", rng.integers(0, 256, (40, 3, 8, 8), dtype=np.uint8))
        np.save(root / "y.npy", np.arange(40) % 4)
        np.save(root / "x_test.npy", rng.integers(0, 256, (10, 3, 8, 8), dtype=np.uint8))
        np.save(root / "y_test.npy", np.arange(10) % 4)
    mode = "r" if mmap else None
    return {name: np.load(root / f"{name}.npy", mmap_mode=mode) for name in ("x", "y", "x_test", "y_test")}


def _cfg(folder: Path, mmap: bool) -> ExperimentConfig:
    data = DataConfig(
        name="custom",
        factory="tests.unit.data.test_custom_mmap:arrays",
        kwargs={"folder": str(folder), "mmap": mmap},
        partition="dirichlet",
        dirichlet_alpha=0.5,
        num_clients=5,
    )
    return ExperimentConfig(
        name="custom-mmap",
        rounds=2,
        clients_per_round=3,
        data=data,
        model=CNNConfig(channels=(4, 8)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=4, lr=0.05, optimizer="sgd"),
        backend=BackendConfig(kind="local", num_hosts=2),
    )


def test_mapped_custom_arrays_stay_maps_and_give_the_same_clients_and_records(tmp_path: Path) -> None:
    mapped = build_federated_dataset(_cfg(tmp_path, True).data, seed=0)
    held = build_federated_dataset(_cfg(tmp_path, False).data, seed=0)
    assert isinstance(mapped.x, IndexedRows) and isinstance(mapped.x_test, IndexedRows)
    assert isinstance(held.x, np.ndarray) and not isinstance(held.x, np.memmap)
    assert np.array_equal(mapped.offsets, held.offsets) and np.array_equal(mapped.y, held.y)
    for c in range(held.num_clients):
        assert np.array_equal(mapped.client_train(c)[0], held.client_train(c)[0])
    assert np.array_equal(np.asarray(mapped.x_test), held.x_test)
    a = run_experiment(_cfg(tmp_path, True), write=False)
    b = run_experiment(_cfg(tmp_path, False), write=False)
    assert [r.train_loss for r in a.records] == [r.train_loss for r in b.records]
    assert a.records[-1].test_acc == b.records[-1].test_acc and a.records[-1].test_loss == b.records[-1].test_loss
    for name, tensor in a.state.params.items():
        assert bool((tensor == b.state.params[name]).all()), name
