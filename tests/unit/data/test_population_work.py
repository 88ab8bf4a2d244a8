"""What a run's data set-up makes per client beyond the clients it trains (issue 30): counted against the population,
not timed (``benchmarks/population_setup.py`` gives the seconds)."""

from __future__ import annotations

import numpy as np
import pytest

from rayfl.config.sections import DataConfig
from rayfl.data import build_federated_dataset, image_labels
from rayfl.data.federated import LazyRows
from rayfl.data.image_labels import label_images  # the original, as imported before any test patches it
from tests.helpers import count_data_work


def test_a_validation_split_makes_no_image_or_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.val_fraction`` over 20,000 clients whose images and labels are made on demand holds out rows, not data:
    set-up makes the 1,000 test images and labels only, as with 20 clients; the validation set's labels are made when
    read (FedorAS's search reads a seeded sample of them), and are its images' labels."""
    made = count_data_work(monkeypatch)

    seen = {}
    for n in (20, 20_000):
        cfg = DataConfig(
            name="synthetic", partition="iid", num_clients=n, synthetic_samples=8, synthetic_labels="image",
            val_fraction=0.25,
        )  # fmt: skip
        made.clear()
        split = build_federated_dataset(cfg, 1)
        seen[n] = dict(made)
    assert seen[20] == seen[20_000] == {"images": 1000}  # the test set (its labels: the synthetic module's own call)
    assert isinstance(split.y_val, LazyRows) and len(split.y_val) == 2 * 20_000
    assert split.x_val is not None
    rows = np.asarray(split.x_val[-16:])
    assert np.array_equal(split.y_val[-16:], label_images(rows, image_labels.teacher_directions(1)))
