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
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from rayfl.config import DataConfig
from rayfl.data import partition
from rayfl.data.federated import FederatedDataset
from rayfl.rng import derive_rng

__all__ = ["NUM_CLASSES", "TEST_SIZE", "load_synthetic", "synthetic_images"]

NUM_CLASSES = 10
TEST_SIZE = 1000
_GRID = 4  # teacher features: channel means over a _GRID × _GRID grid of blocks
_CHUNK = 8192  # images labelled per step, to bound the float temporaries


def _teacher(seed: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Per-pixel weights ``[3072, NUM_CLASSES]`` and bias ``[NUM_CLASSES]`` of the labelling function.

    Ten unit-norm random directions over the 48 block means (equal norms: no class is favoured a priori),
    expanded to the pixels so that labelling is one matrix product on the raw ``uint8`` values.
    """
    block = 32 // _GRID
    w = derive_rng(seed, "synthetic_teacher").standard_normal((3 * _GRID * _GRID, NUM_CLASSES))
    w /= np.linalg.norm(w, axis=0, keepdims=True)
    # a block mean, centred and scaled to [-1, 1]: (sum of its pixels / block² - 127.5) / 127.5
    per_pixel = np.repeat(np.repeat(w.reshape(3, _GRID, _GRID, NUM_CLASSES), block, 1), block, 2)
    per_pixel = per_pixel.reshape(3 * 32 * 32, NUM_CLASSES) / (block * block * 127.5)
    bias = -w.sum(axis=0)
    return per_pixel.astype(np.float32), bias.astype(np.float32)


def _label(x: npt.NDArray[np.uint8], seed: int) -> npt.NDArray[np.int64]:
    weights, bias = _teacher(seed)
    flat = x.reshape(len(x), -1)
    out = np.empty(len(x), dtype=np.int64)
    for lo in range(0, len(x), _CHUNK):
        logits = flat[lo : lo + _CHUNK].astype(np.float32) @ weights + bias
        out[lo : lo + len(logits)] = np.argmax(logits, axis=1)
    return out


def synthetic_images(
    num: int, seed: int, purpose: str, noise: float = 1.0
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """``num`` images ``uint8[num, 3, 32, 32]`` from ``derive_rng(seed, purpose)`` and their labels; ``noise`` < 1
    mixes in random blocks from ``derive_rng(seed, purpose + "/blocks")`` (see the module docstring)."""
    x = derive_rng(seed, purpose).integers(0, 256, size=(num, 3, 32, 32), dtype=np.uint8)
    if noise < 1.0:
        block = 32 // _GRID
        blocks = derive_rng(seed, f"{purpose}/blocks").integers(0, 256, size=(num, 3, _GRID, _GRID), dtype=np.uint8)
        for lo in range(0, num, _CHUNK):  # chunks bound the float temporaries
            up = np.repeat(np.repeat(blocks[lo : lo + _CHUNK], block, 2), block, 3).astype(np.float32)
            mixed = (1.0 - noise) * up + noise * x[lo : lo + _CHUNK].astype(np.float32)
            x[lo : lo + _CHUNK] = np.clip(np.rint(mixed), 0, 255).astype(np.uint8)
    return x, _label(x, seed)


def load_synthetic(cfg: DataConfig, seed: int) -> FederatedDataset:
    """``cfg.num_clients`` clients with ``cfg.synthetic_samples`` images each on average, and a 1000-image test set
    (see the module docstring for the split)."""
    num_clients, per_client = cfg.num_clients, cfg.synthetic_samples
    if num_clients < 1 or per_client < 1:
        raise ValueError("synthetic data needs data.num_clients >= 1 and data.synthetic_samples >= 1")
    x, y = synthetic_images(num_clients * per_client, seed, "synthetic_train", cfg.synthetic_noise)
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
    if cfg.partition == "dirichlet":
        parts = partition.dirichlet(y, num_clients, cfg.dirichlet_alpha, derive_rng(seed, "partition"))
        order = np.concatenate(parts)
        x, y = x[order], y[order]  # one gather into client-major order
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
        client_names=tuple(f"client{c:0{width}d}" for c in range(num_clients)),
        meta=meta,
    )
