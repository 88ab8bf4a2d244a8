"""torchvision's ResNet-18 on generated images, given to rayfl by import path.

``examples/resnet18_synthetic.yaml`` names ``examples.resnet_synthetic:resnet18`` as the model factory and
``examples.resnet_synthetic:images`` as the data factory; run it from the repository root (so ``examples`` is
importable on the driver and in Ray's workers).
"""

from __future__ import annotations

import numpy as np
import torchvision
from torch import nn


def resnet18(num_classes: int) -> nn.Module:
    """torchvision's ResNet-18 with a ``num_classes``-way head (rayfl passes the data's class count)."""
    return torchvision.models.resnet18(weights=None, num_classes=num_classes)


def images(
    seed: int, num_samples: int = 1024, num_test: int = 256, size: int = 16, contrast: int = 56
) -> dict[str, np.ndarray]:
    """Centralised ``uint8`` RGB noise images whose label is the quadrant made brighter; rayfl partitions them.

    Every pixel is uniform noise in ``0 .. 255 - contrast``; the labelled quadrant (uniform over four) gets
    ``contrast`` added, so it is always the brightest and the most-frequent-label baseline is about 25 %.
    """
    rng = np.random.default_rng(seed)
    n = num_samples + num_test
    x = rng.integers(0, 256 - contrast, size=(n, 3, size, size), dtype=np.uint8)
    y = rng.integers(0, 4, size=n, dtype=np.int64)
    half = size // 2
    for label, (rows, cols) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        pick = y == label
        x[pick, :, rows * half : (rows + 1) * half, cols * half : (cols + 1) * half] += np.uint8(contrast)
    return {"x": x[:num_samples], "y": y[:num_samples], "x_test": x[num_samples:], "y_test": y[num_samples:]}
