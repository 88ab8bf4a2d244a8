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


def _per_client_split(offsets: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The validation split as one loop over clients (the rule ``hold_out_validation`` documents, written plainly)."""
    rng = np.random.default_rng(seed)
    keep, held = [], []
    for c in range(len(offsets) - 1):
        lo, n = int(offsets[c]), int(offsets[c + 1] - offsets[c])
        k = min(max(round(fraction * n), 1 if n >= 2 else 0), max(n - 1, 0))
        order = rng.permutation(n)
        keep.append(lo + np.sort(order[k:]))
        held.append(lo + np.sort(order[:k]))
    return np.concatenate(keep), np.concatenate(held)


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5])
def test_the_validation_split_holds_out_the_rows_a_per_client_loop_does(
    monkeypatch: pytest.MonkeyPatch, fraction: float
) -> None:
    """Marking every client's held-out rows at once (chunks of clients) picks the rows one loop over clients picks,
    from the same generator stream: clients of 0, 1, 2 and uneven sizes, over more than one chunk."""
    from rayfl.data import federated

    monkeypatch.setattr(federated, "_VAL_CHUNK", 7)
    sizes = np.random.default_rng(3).choice([0, 1, 2, 3, 5, 8, 13, 40], size=50)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rows = np.arange(int(offsets[-1]) * 2, dtype=np.float32).reshape(-1, 2)
    ds = federated.FederatedDataset(
        name="rows", input_kind="image", num_classes=2, x=rows, y=np.arange(len(rows)) % 2, offsets=offsets,
        x_test=rows[:4], y_test=np.zeros(4, dtype=np.int64),
    )  # fmt: skip
    split = federated.hold_out_validation(ds, fraction, np.random.default_rng(11))
    keep, held = _per_client_split(offsets, fraction, 11)
    assert np.array_equal(np.asarray(split.x)[:, 0] // 2, keep)
    assert np.array_equal(np.asarray(split.x_val)[:, 0] // 2, held)
    assert np.array_equal(np.diff(split.offsets), np.diff(np.searchsorted(keep, offsets)))  # kept rows per client
