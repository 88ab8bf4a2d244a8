"""A generated image task for benchmarks and tests: no files, any number of clients, learnable labels.

Images are uniform random ``uint8[3, 32, 32]``. A random linear "teacher" labels them: it averages each
channel over a 4×4 grid of 8×8 blocks and takes the arg-max of ten fixed random linear functions of those 48
block means. The labels are thus a linear function of the pixels that a small convolutional network can learn,
and the class balance is roughly even. Everything is drawn from ``derive_rng(seed, ...)`` in a few
vectorised calls.

``data.synthetic_noise`` below 1 mixes the pixel noise with uniform random 8×8 blocks (the teacher's grid):
``x = (1 - noise) * blocks + noise * pixels``. The block means then carry most of an image's variance, so the
labels stand out of the noise and a small ResNet learns them in a few hundred steps rather than thousands (what
the CPU-sized stand-ins of the CIFAR-10 settings need). At 1 the images are the pure noise above, bit for bit.

Clients. With ``data.partition`` ``natural`` or ``iid`` every client gets ``synthetic_samples`` consecutive images
(the images are independent draws, so consecutive blocks are already an IID split). With ``dirichlet`` the same
pool of ``num_clients x synthetic_samples`` images is split by ``rayfl.data.partition.dirichlet`` with
``dirichlet_alpha``, as CIFAR-10 is: label skew and unequal client sizes, so CPU-sized stand-ins for CIFAR-10
settings keep their partition kind.

Images on demand. The training images are never held: ``x`` is a ``SyntheticImages`` recipe that makes any rows when
indexed, so a run with 10,000 clients holds no pixels (8 bytes of label and 8 of pool index per image under
``dirichlet``) rather than 3,072 bytes an image, in the driver, the object store and every host alike. This reproduces
the materialised pool exactly, image for image: ``integers(0, 256, dtype=uint8)`` over the full range fills bytes from
the generator's 32-bit outputs, low byte first, and PCG64 serves 32-bit outputs as the low then the high half of each
64-bit output, so the pool's bytes are the little-endian bytes of ``random_raw``; an image is 3,072 bytes, 384 64-bit
outputs, so image ``i`` starts after ``PCG64.advance(384 * i)`` (its blocks after ``advance(6 * i)``).
``test_synthetic_images_are_todays`` pins both against digests of the arrays the eager generator made.

Labels on demand. The teacher's float32 matrix product is not bitwise the same for a row alone as within its
8192-row chunk (BLAS kernels sum in an order that depends on the row's place in the block), so a pool label is only
the pool's when its whole chunk is labelled as one block, the chunks counted from the pool's first image.
``PoolLabels`` is such a ``y``: indexed, it labels the ``_CHUNK``-aligned chunks that hold the rows asked for, in the
very arithmetic the eager code used over the whole pool (``_pool_labels``), and keeps the labels it made (a byte an
image), so that a process labels a chunk once at most. Set-up labels nothing (labelling a million clients' pool of 64
images each took minutes); the first client to read a chunk pays for it (8,192 images made and labelled: about 0.08 s
of CPU, 0.35 s at noise 0.25) when it trains. A Dirichlet pool split still needs every label at set-up.

Labels per image. ``data.synthetic_labels: image`` labels each image alone instead, when a client trains
(``rayfl/data/image_labels.py``): the same teacher in arithmetic that no other row can change, so a client labels
only its own images, and client ``i``'s images and labels are the same whatever ``num_clients`` is. Its labels equal
the pool's except in near-ties, so it is a separate setting and ``pool`` stays the default.

Dirichlet splits by counts. A pool split needs every image's label. ``data.dirichlet_split: counts`` draws each client's
label counts from the label distribution instead and finds the client's images by label when it trains
(``rayfl/data/dirichlet_counts.py``): nothing is labelled at set-up, client ``i``'s data does not depend on
``num_clients``, and the images and labels are per-image ones (``synthetic_labels`` is then ``image`` in effect). It is
a different split of different images, so ``pool`` stays the default and old records stay as they were.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from rayfl.config.sections import DataConfig
from rayfl.core.rng import derive_rng
from rayfl.data import partition
from rayfl.data.blas_threads import one_blas_thread
from rayfl.data.client_names import NumberedNames
from rayfl.data.dirichlet_counts import CountedImages, CountedLabels, client_label_counts
from rayfl.data.federated import FederatedDataset, LazyRows, Rows
from rayfl.data.image_labels import ImageLabels, label_images, teacher_directions

__all__ = ["NUM_CLASSES", "TEST_SIZE", "PoolLabels", "SyntheticImages", "load_synthetic", "synthetic_images"]

NUM_CLASSES = 10
TEST_SIZE = 1000
_GRID = 4  # teacher features: channel means over a _GRID × _GRID grid of blocks
_CHUNK = 8192  # images labelled per step, to bound the float temporaries (and the labels' BLAS blocks: keep it)
_IMAGE_SHAPE = (3, 32, 32)
_RAW_PER_IMAGE = 3 * 32 * 32 // 8  # 64-bit generator outputs per image
_RAW_PER_BLOCKS = 3 * _GRID * _GRID // 8  # ... per image's grid of blocks


def _teacher(seed: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Per-pixel weights ``[3072, NUM_CLASSES]`` and bias ``[NUM_CLASSES]`` of the labelling function.

    Ten unit-norm random directions over the 48 block means (equal norms: no class is favoured a priori),
    expanded to the pixels so that labelling is one matrix product on the raw ``uint8`` values.
    """
    block = 32 // _GRID
    w = teacher_directions(seed)
    # a block mean, centred and scaled to [-1, 1]: (sum of its pixels / block² - 127.5) / 127.5
    per_pixel = np.repeat(np.repeat(w.reshape(3, _GRID, _GRID, NUM_CLASSES), block, 1), block, 2)
    per_pixel = per_pixel.reshape(3 * 32 * 32, NUM_CLASSES) / (block * block * 127.5)
    bias = -w.sum(axis=0)
    return per_pixel.astype(np.float32), bias.astype(np.float32)


class _Teacher:
    """Labels chunk by chunk with one float buffer (a fresh 100 MB array per chunk costs more in page faults than
    the product itself)."""

    def __init__(self, seed: int) -> None:
        self.weights, self.bias = _teacher(seed)
        self.buf = np.empty((0, 3 * 32 * 32), dtype=np.float32)

    def label_chunk(self, x: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
        """Labels of at most ``_CHUNK`` images, computed as one block (the block fixes the float32 sums)."""
        if len(self.buf) < len(x):
            self.buf = np.empty((len(x), 3 * 32 * 32), dtype=np.float32)
        rows = self.buf[: len(x)]
        np.copyto(rows, x.reshape(len(x), -1), casting="safe")
        logits = rows @ self.weights + self.bias
        labels: npt.NDArray[np.int64] = np.argmax(logits, axis=1).astype(np.int64)
        return labels


def _label(x: npt.NDArray[np.uint8], seed: int) -> npt.NDArray[np.int64]:
    """The teacher's labels of ``x``, in chunks of ``_CHUNK`` rows from its first (the chunks fix the float32 sums)."""
    teacher = _Teacher(seed)
    out = np.empty(len(x), dtype=np.int64)
    for lo in range(0, len(x), _CHUNK):
        out[lo : lo + _CHUNK] = teacher.label_chunk(x[lo : lo + _CHUNK])
    return out


def _raw_bytes(state: Any, index: npt.NDArray[np.int64], per_item: int) -> npt.NDArray[np.uint8]:
    """The bytes of items ``index`` of the stream a PCG64 in ``state`` fills ``per_item`` 64-bit outputs per item
    with (see the module docstring), ``uint8[len(index), 8 * per_item]``; one jump per run of consecutive items."""
    if len(index) == 0:
        return np.empty((0, 8 * per_item), dtype=np.uint8)
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    bits = np.random.PCG64()
    if len(breaks) == 0:  # one run (a client's rows, a labelling chunk): the generator's own array, no copy
        bits.state = state
        bits.advance(int(index[0]) * per_item)
        raw = bits.random_raw(len(index) * per_item).astype("<u8", copy=False)
        return raw.view(np.uint8).reshape(len(index), -1)
    out = np.empty((len(index), 8 * per_item), dtype=np.uint8)
    starts = np.concatenate([[0], breaks]).tolist()
    ends = [*breaks.tolist(), len(index)]
    for lo, hi in zip(starts, ends, strict=True):
        bits.state = state
        bits.advance(int(index[lo]) * per_item)
        raw = bits.random_raw((hi - lo) * per_item).astype("<u8", copy=False)
        out[lo:hi] = raw.view(np.uint8).reshape(hi - lo, -1)
    return out


def _mix(x: npt.NDArray[np.uint8], blocks: npt.NDArray[np.uint8], noise: float) -> None:
    """``x = (1 - noise) * blocks + noise * x`` in place, per element (so any grouping of rows gives the same)."""
    block = 32 // _GRID
    for lo in range(0, len(x), _CHUNK):  # chunks bound the float temporaries
        up = np.repeat(np.repeat(blocks[lo : lo + _CHUNK], block, 2), block, 3).astype(np.float32)
        mixed = (1.0 - noise) * up + noise * x[lo : lo + _CHUNK].astype(np.float32)
        x[lo : lo + _CHUNK] = np.clip(np.rint(mixed), 0, 255).astype(np.uint8)


class SyntheticImages(LazyRows):
    """The images of a synthetic pool, made when indexed: row ``r`` is pool image ``order[r]`` (``r`` without an
    order) of the stream ``derive_rng(seed, purpose)`` with ``noise`` (see the module docstring). Pickles as its
    recipe: the seed, the purpose, the noise and the order."""

    dtype = np.dtype(np.uint8)

    def __init__(
        self, seed: int, purpose: str, num: int, noise: float = 1.0, order: npt.NDArray[np.int64] | None = None
    ) -> None:
        if order is not None and len(order) != num:
            raise ValueError(f"an order of {len(order)} images for a pool of {num}")
        self.seed, self.purpose, self.num, self.noise, self.order = seed, purpose, num, noise, order
        self.shape = (num, *_IMAGE_SHAPE)

    def __reduce__(self) -> tuple[Any, ...]:
        return (SyntheticImages, (self.seed, self.purpose, self.num, self.noise, self.order))

    @cached_property
    def _states(self) -> tuple[Any, Any]:
        """The generators' start states: pixels and blocks."""
        pixels = derive_rng(self.seed, self.purpose).bit_generator.state
        blocks = derive_rng(self.seed, f"{self.purpose}/blocks").bit_generator.state
        return pixels, blocks

    def pool(self, index: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
        """Pool images ``index`` (positions in the stream, not rows of this order)."""
        pixels, blocks = self._states
        x = _raw_bytes(pixels, index, _RAW_PER_IMAGE).reshape(len(index), *_IMAGE_SHAPE)
        if self.noise < 1.0:
            grid = _raw_bytes(blocks, index, _RAW_PER_BLOCKS).reshape(len(index), 3, _GRID, _GRID)
            _mix(x, grid, self.noise)
        return x

    def take(self, index: npt.NDArray[np.int64]) -> np.ndarray:
        return self.pool(index if self.order is None else self.order[index])


def synthetic_images(
    num: int, seed: int, purpose: str, noise: float = 1.0
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """``num`` images ``uint8[num, 3, 32, 32]`` from ``derive_rng(seed, purpose)`` and their labels; ``noise`` < 1
    mixes in random blocks from ``derive_rng(seed, purpose + "/blocks")`` (see the module docstring)."""
    x = SyntheticImages(seed, purpose, num, noise).pool(np.arange(num, dtype=np.int64))
    return x, _label(x, seed)


def _pool_labels(images: SyntheticImages) -> npt.NDArray[np.int64]:
    """Labels of the whole pool, one ``_CHUNK`` of images at a time (the chunks the labels were always made in)."""
    teacher = _Teacher(images.seed)
    out = np.empty(images.num, dtype=np.int64)
    for lo in range(0, images.num, _CHUNK):
        hi = min(lo + _CHUNK, images.num)
        out[lo:hi] = teacher.label_chunk(images.pool(np.arange(lo, hi, dtype=np.int64)))
    return out


class PoolLabels(LazyRows):
    """The teacher's labels of a synthetic pool, made when indexed: a data set's ``y`` that holds no labels, so that
    setting up a million clients labels none of them. A label is made within its whole ``_CHUNK``-aligned chunk of the
    pool, as ``_pool_labels`` makes it (the chunk fixes the float32 sums: see the module docstring), so the labels are
    the pool's bit for bit; the chunks made are kept, a byte a label, for the process's later reads. Pickles as the
    images' recipe, without them."""

    dtype = np.dtype(np.int64)

    def __init__(self, images: SyntheticImages) -> None:
        if images.order is not None:
            raise ValueError("pool labels follow the pool's own order: give the images without an order")
        self.images = images
        self.shape = (images.num,)
        self._kept: dict[int, npt.NDArray[np.uint8]] = {}  # chunk -> its labels

    def __reduce__(self) -> tuple[Any, ...]:
        return (PoolLabels, (self.images,))

    def _label(self, chunks: list[int]) -> None:
        """Make and keep the labels of ``chunks`` (chunk ``c``: pool images ``c * _CHUNK`` on) as ``_pool_labels`` makes
        them, at one BLAS thread as a data set is built (``rayfl/data/blas_threads.py``), in whichever process reads;
        one teacher and float buffer for them all, dropped after. Two threads reading one new chunk at once both make
        it, the same labels."""
        teacher = _Teacher(self.images.seed)
        for chunk in chunks:
            lo = chunk * _CHUNK
            hi = min(lo + _CHUNK, self.images.num)
            with one_blas_thread():
                labels = teacher.label_chunk(self.images.pool(np.arange(lo, hi, dtype=np.int64)))
            self._kept[chunk] = labels.astype(np.uint8)  # NUM_CLASSES labels: a byte each

    def take(self, index: npt.NDArray[np.int64]) -> np.ndarray:
        index = np.asarray(index, dtype=np.int64)
        chunks = index // _CHUNK
        by_chunk = np.argsort(chunks, kind="stable")
        groups = np.split(by_chunk, np.flatnonzero(np.diff(chunks[by_chunk])) + 1) if len(index) else []
        missing = [c for c in (int(chunks[rows[0]]) for rows in groups) if c not in self._kept]
        if missing:
            self._label(missing)
        out = np.empty(len(index), dtype=np.int64)
        for rows in groups:
            chunk = int(chunks[rows[0]])
            out[rows] = self._kept[chunk][index[rows] - chunk * _CHUNK]
        return out

    def every(self) -> npt.NDArray[np.int64]:
        """All the labels, chunk by chunk (a partition that needs them), without keeping any chunk's."""
        return _pool_labels(self.images)


def load_synthetic(cfg: DataConfig, seed: int) -> FederatedDataset:
    """``cfg.num_clients`` clients with ``cfg.synthetic_samples`` images each on average, and a 1000-image test set
    (see the module docstring for the split); the training images are made on demand (``SyntheticImages``), and their
    labels too (``PoolLabels``, or ``ImageLabels`` with ``synthetic_labels: image``), unless a Dirichlet pool split
    needs them all.
    """
    num_clients, per_client = cfg.num_clients, cfg.synthetic_samples
    if num_clients < 1 or per_client < 1:
        raise ValueError("synthetic data needs data.num_clients >= 1 and data.synthetic_samples >= 1")
    pool = SyntheticImages(seed, "synthetic_train", num_clients * per_client, cfg.synthetic_noise)
    # a counts split labels each image alone (its images are found by label), and the pool's labels are not needed
    per_image = cfg.synthetic_labels == "image" or (cfg.partition == "dirichlet" and cfg.dirichlet_split == "counts")
    lazy = ImageLabels(pool, seed) if per_image else PoolLabels(pool)  # nothing labelled yet
    y: Rows = lazy
    if per_image:
        x_test = SyntheticImages(seed, "synthetic_test", TEST_SIZE, cfg.synthetic_noise).pool(
            np.arange(TEST_SIZE, dtype=np.int64)
        )
        y_test = label_images(x_test, teacher_directions(seed))
    else:
        x_test, y_test = synthetic_images(TEST_SIZE, seed, "synthetic_test", cfg.synthetic_noise)
    offsets = np.arange(num_clients + 1, dtype=np.int64) * per_client
    meta: dict[str, object] = {
        "mean": [0.5, 0.5, 0.5],
        "std": [0.25, 0.25, 0.25],
        "layout": "NCHW",
        "teacher": "block-linear",
        "partition": cfg.partition,
        "noise": cfg.synthetic_noise,
    }
    if per_image:
        meta["labels"] = "image"
    x: LazyRows = pool
    if cfg.partition == "dirichlet" and cfg.dirichlet_split == "counts":
        share = np.bincount(y_test, minlength=NUM_CLASSES) / len(y_test)
        rng = derive_rng(seed, "partition/counts")
        counts = client_label_counts(num_clients, per_client, cfg.dirichlet_alpha, share, rng)
        stream = SyntheticImages(seed, "synthetic_train/dirichlet", 1, cfg.synthetic_noise)
        counted = CountedImages(counts, seed, stream)
        x, y, offsets = counted, CountedLabels(counts), counted.offsets
        meta.update(dirichlet_alpha=cfg.dirichlet_alpha, dirichlet_split="counts", labels="image")
    elif cfg.partition == "dirichlet":
        labels = lazy.every()  # the pool split needs every label
        parts = partition.dirichlet(labels, num_clients, cfg.dirichlet_alpha, derive_rng(seed, "partition"))
        order = np.concatenate(parts).astype(np.int64)
        x = SyntheticImages(seed, "synthetic_train", pool.num, cfg.synthetic_noise, order)  # client-major rows
        y = labels[order]
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
        meta["dirichlet_alpha"] = cfg.dirichlet_alpha
    width = max(4, len(str(num_clients - 1)))
    return FederatedDataset(
        name="synthetic",
        input_kind="image",
        num_classes=NUM_CLASSES,
        x=x,
        y=y,
        offsets=offsets,
        x_test=x_test,
        y_test=y_test,
        client_names=NumberedNames("client", num_clients, width),
        meta=meta,
    )
