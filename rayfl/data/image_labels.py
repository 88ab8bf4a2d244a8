"""Synthetic labels that each image carries alone (``data.synthetic_labels: image``): made on demand, for any rows.

The pool labels of ``rayfl/data/synthetic.py`` come from a float32 matrix product over 8,192-image chunks, whose last
bits depend on where a row sits in its chunk (the BLAS kernel's summation order), so one client's labels can only be
had by labelling its whole chunk (``PoolLabels``): about 0.08 s per chunk a client reads first. Here the same teacher
(the same ten directions over the 48 block means, ``derive_rng(seed, "synthetic_teacher")``) is evaluated per image
in arithmetic whose result does not depend on the other rows: block sums of ``uint8`` pixels are exact integers, and
the 48 terms of each logit are added in float64 one feature at a time, element-wise. A label is then a pure function
of the image, so a client's labels are made when it trains, from its own rows, and client ``i``'s data is the same
whatever the number of clients.

The labelling function is the pool's, up to rounding: the two can disagree only where the top two logits lie within
float32 rounding of each other (none of 9,000 images at seed 5, noise 1 or 0.25; a 100-client FedAvg run's records
were the same), so ``synthetic_labels: image`` is its own setting, not promised bit for bit equal to ``pool``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from rayfl.core.rng import derive_rng
from rayfl.data.federated import LazyRows

__all__ = ["ImageLabels", "label_images", "teacher_directions"]

GRID = 4  # block means over a GRID x GRID grid per channel (rayfl/data/synthetic.py's teacher)
NUM_CLASSES = 10
_BLOCK = 32 // GRID
_CHUNK = 8192  # images summed per step, to bound the temporaries (any grouping gives the same labels)


def teacher_directions(seed: int) -> npt.NDArray[np.float64]:
    """The teacher's ten unit-norm directions over the 48 block means, ``float64[48, NUM_CLASSES]``."""
    w = derive_rng(seed, "synthetic_teacher").standard_normal((3 * GRID * GRID, NUM_CLASSES))
    w /= np.linalg.norm(w, axis=0, keepdims=True)
    return w


def label_images(x: npt.NDArray[np.uint8], directions: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Labels of images ``uint8[n, 3, 32, 32]``: the arg-max over classes of ``sum_j w_j (mean_j / 127.5 - 1)`` over
    the block means ``mean_j``, each image's result independent of the other rows (see the module docstring)."""
    out = np.empty(len(x), dtype=np.int64)
    for lo in range(0, len(x), _CHUNK):
        part = x[lo : lo + _CHUNK]
        sums = part.reshape(len(part), 3, GRID, _BLOCK, GRID, _BLOCK).sum(axis=(3, 5), dtype=np.int64)
        centred = sums.reshape(len(part), -1) / (_BLOCK * _BLOCK * 127.5) - 1.0  # exact integers, one division each
        logits = np.zeros((len(part), NUM_CLASSES))
        for j in range(centred.shape[1]):  # a fixed order of element-wise sums: no row-dependent BLAS blocking
            logits += centred[:, j : j + 1] * directions[j]
        out[lo : lo + len(part)] = np.argmax(logits, axis=1)
    return out


class ImageLabels(LazyRows):
    """The labels of a ``LazyRows`` of images, made when indexed (``label_images``): a data set's ``y`` that holds no
    labels, so that setting up a million clients labels none of them. Pickles as the images' recipe and the seed."""

    dtype = np.dtype(np.int64)

    def __init__(self, images: LazyRows, seed: int) -> None:
        self.images, self.seed = images, seed
        self.shape = (len(images),)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ImageLabels, (self.images, self.seed))

    @cached_property
    def _directions(self) -> npt.NDArray[np.float64]:
        return teacher_directions(self.seed)

    def take(self, index: npt.NDArray[np.int64]) -> np.ndarray:
        return label_images(self.images.take(index), self._directions)

    def every(self) -> npt.NDArray[np.int64]:
        """All the labels, made ``_CHUNK`` images at a time (a partition that needs them: bounded memory)."""
        out = np.empty(len(self), dtype=np.int64)
        for lo in range(0, len(self), _CHUNK):
            out[lo : lo + _CHUNK] = self.take(np.arange(lo, min(lo + _CHUNK, len(self)), dtype=np.int64))
        return out
