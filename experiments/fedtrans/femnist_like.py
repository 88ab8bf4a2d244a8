"""FEMNIST-shaped writers for FedTrans at CPU size (``data.name: custom``; ``femnist.yaml``).

LEAF's FEMNIST (3,597 writers of 28x28 grey characters, 62 classes) cannot be downloaded here, so this factory makes
a stand-in with its shapes and its kind of heterogeneity: natural clients ("writers") whose data differ in *style*
(feature skew) rather than by a partitioner's label skew, and whose sizes differ.

* **Characters.** Each of the 62 classes has a glyph, a 7x7 binary stroke pattern scaled up 4x to 28x28, drawn once
  from ``derive_rng(seed, "femnist-like/glyphs")``: ``families`` random prototypes (about 40 % ink), class ``k`` the
  prototype ``k mod families`` with a fraction ``flip`` of its cells flipped, so classes come in look-alike groups as
  FEMNIST's ``o``/``O``/``0`` or ``l``/``I``/``1`` do.
* **Writers.** Writer ``w`` has its own style from ``derive_rng(seed, "femnist-like/writer", w)``: where on the
  page it writes (a shift of up to 2 pixels each way), how dark its ink and its paper are, and how much its hand
  wobbles (every sample is shifted by up to ``jitter`` more pixels). An image is ``paper + (ink - paper) x glyph``
  shifted, plus Gaussian pixel noise of standard deviation ``noise``, clipped to [0, 1] and stored as ``uint8``.
* **Labels.** Every writer draws labels from the same class frequencies with digits five times as frequent as each
  letter (FEMNIST's forms have every writer write every character; digits are about half of its samples).
* **Sizes.** Writer ``w`` holds a uniform ``[per_client // 2, 3 * per_client // 2]`` training samples and a quarter as
  many test samples (at least 4) in the same style: its own test set, for paper 002's average client accuracy.

The global test set is the union of the writers' test sets (``from_client_arrays``).
"""

from __future__ import annotations

import numpy as np

from rayfl.core.rng import derive_rng
from rayfl.data import FederatedDataset, from_client_arrays

__all__ = ["NUM_CLASSES", "writers"]

NUM_CLASSES = 62  # 10 digits, 26 upper-case and 26 lower-case letters
_GRID, _UP = 7, 4  # glyphs are 7x7 strokes scaled up to 28x28


def _glyphs(seed: int, families: int, flip: float) -> np.ndarray:
    rng = derive_rng(seed, "femnist-like/glyphs")
    prototypes = rng.random((families, _GRID, _GRID)) < 0.4
    family = np.arange(NUM_CLASSES) % families
    strokes = prototypes[family] ^ (rng.random((NUM_CLASSES, _GRID, _GRID)) < flip)
    return np.kron(strokes.astype(np.float32), np.ones((_UP, _UP), dtype=np.float32))  # (62, 28, 28)


def _class_frequencies() -> np.ndarray:
    weights = np.ones(NUM_CLASSES)
    weights[:10] = 5.0
    out: np.ndarray = weights / weights.sum()
    return out


def _write(glyphs: np.ndarray, labels: np.ndarray, rng: np.random.Generator, jitter: int, noise: float) -> np.ndarray:
    """One writer's images of ``labels`` (``uint8[n, 1, 28, 28]``) in the style drawn first from ``rng``."""
    dy, dx = rng.integers(-2, 3, size=2)
    ink, paper = rng.uniform(0.7, 1.0), rng.uniform(0.0, 0.25)
    n = len(labels)
    shifts = rng.integers(-jitter, jitter + 1, size=(n, 2))
    out = np.empty((n, 1, _GRID * _UP, _GRID * _UP), dtype=np.uint8)
    for k, (label, (sy, sx)) in enumerate(zip(labels, shifts, strict=True)):
        glyph = np.roll(glyphs[label], (int(dy + sy), int(dx + sx)), axis=(0, 1))
        pixels = paper + (ink - paper) * glyph + noise * rng.standard_normal(glyph.shape)
        out[k, 0] = np.clip(np.rint(255.0 * pixels), 0, 255).astype(np.uint8)
    return out


def writers(
    num_clients: int = 100,
    per_client: int = 60,
    jitter: int = 2,
    noise: float = 0.8,
    families: int = 12,
    flip: float = 0.12,
    seed: int = 0,
) -> FederatedDataset:
    """``num_clients`` writers of 1x28x28 grey characters over 62 classes (module docstring)."""
    if num_clients < 1 or per_client < 2:
        raise ValueError("femnist_like.writers needs num_clients >= 1 and per_client >= 2")
    glyphs = _glyphs(seed, families, flip)
    freq = _class_frequencies()
    train: list[tuple[np.ndarray, np.ndarray]] = []
    test: list[tuple[np.ndarray, np.ndarray]] = []
    for w in range(num_clients):
        rng = derive_rng(seed, "femnist-like/writer", w)
        n_train = int(rng.integers(per_client // 2, 3 * per_client // 2 + 1))
        n_test = max(4, n_train // 4)
        labels = rng.choice(NUM_CLASSES, size=n_train + n_test, p=freq).astype(np.int64)
        images = _write(glyphs, labels, rng, jitter, noise)
        train.append((images[:n_train], labels[:n_train]))
        test.append((images[n_train:], labels[n_train:]))
    width = max(4, len(str(num_clients - 1)))
    names = tuple(f"writer{w:0{width}d}" for w in range(num_clients))
    meta: dict[str, object] = {"mean": [0.5], "std": [0.25], "layout": "NCHW", "style": "femnist-like writers"}
    empty_x, empty_y = np.empty((0, 1, 28, 28), dtype=np.uint8), np.empty(0, dtype=np.int64)
    return from_client_arrays(
        "femnist-like", "image", NUM_CLASSES, train, empty_x, empty_y, test=test, client_names=names, meta=meta
    )
