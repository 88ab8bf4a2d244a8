"""Synthetic labels made per image (``data.synthetic_labels: image``): on demand, independent of the population."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from rayfl.config.sections import DataConfig
from rayfl.data.client_names import NumberedNames
from rayfl.data.federated import LazyRows
from rayfl.data.image_labels import ImageLabels, label_images, teacher_directions
from rayfl.data.synthetic import SyntheticImages, load_synthetic


def _image_cfg(num_clients: int, **kwargs: Any) -> DataConfig:
    return DataConfig(
        name="synthetic", num_clients=num_clients, synthetic_samples=20, synthetic_labels="image", **kwargs
    )


@pytest.mark.parametrize("noise", [1.0, 0.25])
def test_client_data_does_not_depend_on_the_number_of_clients(noise: float) -> None:
    """Client ``i``'s images and labels are the same in a run of 3 clients and one of 5,000, and nothing is labelled
    at set-up: the labels are a recipe."""
    small = load_synthetic(_image_cfg(3, synthetic_noise=noise), seed=4)
    large = load_synthetic(_image_cfg(5000, synthetic_noise=noise), seed=4)
    assert isinstance(large.y, ImageLabels) and large.meta["labels"] == "image"
    for c in range(3):
        xs, ys = small.client_train(c)
        xl, yl = large.client_train(c)
        assert np.array_equal(xs, xl) and np.array_equal(ys, yl)
    assert np.array_equal(small.x_test, large.x_test) and np.array_equal(small.y_test, large.y_test)
    # a label is the image's alone: labelled one row at a time or with 200 others, the same
    rows = np.asarray(large.x[np.arange(4000, 4200)])
    whole = label_images(rows, teacher_directions(4))
    assert np.array_equal(whole, [label_images(rows[i : i + 1], teacher_directions(4))[0] for i in range(200)])
    assert np.array_equal(whole, large.y[4000:4200])


def test_image_labels_are_the_pool_teacher_up_to_near_ties() -> None:
    """The per-image labels are the pool teacher's function: on 9,000 images they disagree in near-ties only (the
    float32 pool labels round differently), and every class occurs."""
    pool = load_synthetic(DataConfig(name="synthetic", num_clients=3, synthetic_samples=3000), seed=5)
    image_cfg = DataConfig(name="synthetic", num_clients=3, synthetic_samples=3000, synthetic_labels="image")
    image = load_synthetic(image_cfg, seed=5)
    assert np.array_equal(np.asarray(pool.x), np.asarray(image.x))
    agree = float(np.mean(np.asarray(pool.y) == np.asarray(image.y)))
    assert agree > 0.998
    assert np.array_equal(np.bincount(np.asarray(image.y), minlength=10) > 0, np.ones(10, dtype=bool))


def test_image_labels_pickle_as_a_recipe_and_dirichlet_labels_every_image() -> None:
    ds = load_synthetic(_image_cfg(1000), seed=0)
    blob = pickle.dumps((ds.x, ds.y, ds.client_names))
    assert len(blob) < 2000  # no label, image or name of 20,000 samples and 1,000 clients
    y = pickle.loads(blob)[1]
    assert np.array_equal(y[np.array([5, 19_999, 5])], ds.y[np.array([5, 19_999, 5])])
    # Dirichlet needs every label: they are made, then split as the pool's are
    skewed = load_synthetic(_image_cfg(20, partition="dirichlet", dirichlet_alpha=0.1), seed=0)
    assert isinstance(skewed.y, np.ndarray) and isinstance(skewed.x, LazyRows)
    plain = load_synthetic(_image_cfg(20), seed=0)
    assert sorted(skewed.y.tolist()) == sorted(np.asarray(plain.y).tolist())
    assert np.array_equal(label_images(np.asarray(skewed.x), teacher_directions(0)), skewed.y)


def test_image_labels_index_like_an_array() -> None:
    images = SyntheticImages(7, "synthetic_train", 50)
    labels = ImageLabels(images, 7)
    full = np.asarray(labels)
    assert full.shape == (50,) and full.dtype == np.int64 and len(labels) == 50
    assert np.array_equal(labels[10:20], full[10:20]) and labels[-1] == full[-1]
    assert np.array_equal(labels[np.array([3, 3, 0])], full[[3, 3, 0]])


def test_numbered_names_are_made_when_read() -> None:
    names = NumberedNames("client", 1_000_000, 6)
    assert len(names) == 1_000_000 and names[0] == "client000000" and names[-1] == "client999999"
    assert names[2:4] == ("client000002", "client000003") and list(NumberedNames("c", 2, 4)) == ["c0000", "c0001"]
    assert NumberedNames("c", 2, 4) == ("c0000", "c0001") and "client000017" in NumberedNames("client", 20, 6)
    assert pickle.loads(pickle.dumps(names)) == names and len(pickle.dumps(names)) < 200
    with pytest.raises(IndexError):
        names[1_000_000]
