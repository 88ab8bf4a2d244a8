"""Small, real data sets and configs for tests (no downloads)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, TrainConfig
from rayfl.data.federated import FederatedDataset, from_client_arrays
from rayfl.experiment.schema import ExperimentConfig


def tiny_image_dataset(num_clients: int = 12, per_client: int = 20, seed: int = 0) -> FederatedDataset:
    """A learnable 4-class problem on 3x8x8 uint8 images, labels from a fixed linear teacher."""
    rng = np.random.default_rng(seed)
    teacher = rng.normal(size=(3 * 8 * 8, 4))

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.integers(0, 256, size=(n, 3, 8, 8), dtype=np.uint8)
        return x, (x.reshape(n, -1).astype(np.float64) @ teacher).argmax(1).astype(np.int64)

    train = [make(per_client + c % 3) for c in range(num_clients)]
    x_test, y_test = make(60)
    return from_client_arrays("tiny", "image", 4, train, x_test, y_test, meta={"mean": [0.5] * 3, "std": [0.25] * 3})


def tiny_config(**backend: object) -> ExperimentConfig:
    return ExperimentConfig(
        name="tiny",
        rounds=3,
        clients_per_round=5,
        model=CNNConfig(channels=(8, 16)),
        train=TrainConfig(lr=0.05, batch_size=5, eval_batch_size=16),
        backend=BackendConfig(**backend),  # type: ignore[arg-type]
    )


def tiny_yaml(name: str, rounds: int, extra: str = "") -> str:
    """The text of a tiny synthetic experiment file (CNN on 8 IID clients, 4 per round, in-process) for tests that run
    the command line; ``output_dir`` is left as ``{out}`` to fill with ``.format(out=...)``, ``extra`` is appended
    (e.g. a ``system:`` section)."""
    return (
        f"name: {name}\nrounds: {rounds}\nclients_per_round: 4\noutput_dir: {{out}}\n"
        "data: {{name: synthetic, partition: iid, num_clients: 8, synthetic_samples: 16}}\n"
        "model: {{name: cnn, channels: [4, 8]}}\n"
        "train: {{lr: 0.05, batch_size: 8}}\n"
        "backend: {{kind: local, num_hosts: 1}}\n" + extra
    )


def count_data_work(monkeypatch: Any, *label_users: Any) -> Counter[str]:
    """Count the synthetic images made (``made["images"]``, ``SyntheticImages.pool``) and labelled
    (``made["labels"]``, ``image_labels.label_images``, also where ``label_users`` imported it by name), through
    ``monkeypatch``: the tests that show a set-up does not grow with the population read these counts."""
    from rayfl.data import image_labels
    from rayfl.data.synthetic import SyntheticImages

    made = Counter[str]()
    pool, label = SyntheticImages.pool, image_labels.label_images

    def counted_pool(self: SyntheticImages, index: np.ndarray) -> np.ndarray:
        made["images"] += len(index)
        return pool(self, index)

    def counted_label(x: np.ndarray, directions: np.ndarray) -> np.ndarray:
        made["labels"] += len(x)
        return label(x, directions)

    monkeypatch.setattr(SyntheticImages, "pool", counted_pool)
    for module in (image_labels, *label_users):
        monkeypatch.setattr(module, "label_images", counted_label)
    return made
