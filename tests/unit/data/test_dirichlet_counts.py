"""A Dirichlet split of synthetic data by label counts (``data.dirichlet_split: counts``, issue 30): set-up labels no
image, client ``i``'s data does not depend on the population, and the split is the pool split's large-N limit."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from rayfl.config.sections import DataConfig
from rayfl.core.rng import derive_rng
from rayfl.data import dirichlet_counts, synthetic
from rayfl.data.dirichlet_counts import CountedImages, CountedLabels, client_label_counts
from rayfl.data.image_labels import label_images, teacher_directions
from rayfl.data.synthetic import load_synthetic
from tests.helpers import count_data_work


def _cfg(num_clients: int, **kwargs: Any) -> DataConfig:
    return DataConfig(
        name="synthetic",
        partition="dirichlet",
        dirichlet_split="counts",
        num_clients=num_clients,
        synthetic_samples=16,
        **kwargs,
    )


@pytest.mark.parametrize("noise", [1.0, 0.25])
def test_client_data_does_not_depend_on_the_number_of_clients(noise: float) -> None:
    """Client ``i``'s images and labels are the same among 3 clients and among 5,000, the same again when loaded
    twice, and every label is the teacher's label of its image."""
    small = load_synthetic(_cfg(3, synthetic_noise=noise), seed=4)
    large = load_synthetic(_cfg(5000, synthetic_noise=noise), seed=4)
    again = load_synthetic(_cfg(5000, synthetic_noise=noise), seed=4)
    assert isinstance(large.x, CountedImages) and isinstance(large.y, CountedLabels)
    assert large.meta["dirichlet_split"] == "counts"
    for c in range(3):
        xs, ys = small.client_train(c)
        xl, yl = large.client_train(c)
        assert np.array_equal(xs, xl) and np.array_equal(ys, yl)
        assert np.array_equal(label_images(xl, teacher_directions(4)), yl)
    for c in (0, 2500, 4999):
        assert all(np.array_equal(a, b) for a, b in zip(large.client_train(c), again.client_train(c), strict=True))
    other = load_synthetic(_cfg(3, synthetic_noise=noise), seed=5)
    assert not np.array_equal(other.client_train(0)[0], small.client_train(0)[0])


def test_counts_are_the_pool_splits_large_population_limit() -> None:
    """The pool split gives client ``i`` about ``n_k x p_ki`` of class ``k`` with ``p_k ~ Dirichlet(alpha)`` over the
    clients: sizes average ``synthetic_samples``, classes keep their shares, every client has an image, a small
    ``alpha`` concentrates a client on few classes and a large one spreads it like an IID split."""
    share = np.full(10, 0.1)
    skewed = client_label_counts(20_000, 64, 0.1, share, derive_rng(0, "t"))
    even = client_label_counts(20_000, 64, 100.0, share, derive_rng(0, "t"))
    for counts in (skewed, even):
        assert abs(counts.sum(axis=1).mean() - 64) < 1.0
        assert counts.sum(axis=1).min() >= 1
        assert np.allclose(counts.sum(axis=0) / counts.sum(), share, atol=0.01)
    top_share = lambda c: (c.max(axis=1) / c.sum(axis=1)).mean()  # noqa: E731
    assert top_share(skewed) > 0.6 and top_share(even) < 0.25
    # the first rows do not depend on how many clients are drawn
    assert np.array_equal(client_label_counts(7, 64, 0.1, share, derive_rng(0, "t")), skewed[:7])


def test_set_up_labels_no_image_however_many_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading 1,000,000 clients makes and labels the 1,000 test images only, as loading 10 does; a client's rows
    cost candidates of that client alone; the data set pickles as its recipe (the counts), not images."""
    made = count_data_work(monkeypatch, dirichlet_counts, synthetic)

    seen = {}
    for n in (10, 1_000_000):
        made.clear()
        ds = load_synthetic(_cfg(n), seed=3)
        seen[n] = dict(made)
        assert ds.num_clients == n
    assert seen[10] == seen[1_000_000] == {"images": 1000, "labels": 1000}
    made.clear()
    _, y = ds.client_train(999_999)
    found = dirichlet_counts._BATCH * -(-made["labels"] // dirichlet_counts._BATCH)
    assert made["labels"] == found and found <= 64 * dirichlet_counts._BATCH  # whole batches of candidates, bounded
    assert made["images"] == made["labels"] + len(y)  # the candidates, then the chosen rows
    assert len(pickle.dumps(ds.x)) < 50 * n  # 40 bytes of counts a client


def test_a_counts_split_of_other_data_is_one_line_at_the_key() -> None:
    """``dirichlet_split: counts`` splits the synthetic task only: elsewhere the rules name the key."""
    from rayfl.experiment.rules import semantic_problems
    from rayfl.experiment.schema import ExperimentConfig

    bad = ExperimentConfig(data=DataConfig(name="cifar10", partition="dirichlet", dirichlet_split="counts"))
    assert [p for p in semantic_problems(bad) if p[0] == ("data", "dirichlet_split")]
    good = ExperimentConfig(data=_cfg(100))
    assert not [p for p in semantic_problems(good) if p[0] == ("data", "dirichlet_split")]
