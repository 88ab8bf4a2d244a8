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


def images(seed: int, num_samples: int = 256, num_test: int = 64, size: int = 32) -> dict[str, np.ndarray]:
    """Centralised ``uint8`` RGB images whose label is the brightest of four quadrants; rayfl partitions them."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(num_samples + num_test, 3, size, size), dtype=np.uint8)
    half = size // 2
    quadrants = [x[:, :, :half, :half], x[:, :, :half, half:], x[:, :, half:, :half], x[:, :, half:, half:]]
    y = np.argmax(np.stack([q.mean(axis=(1, 2, 3)) for q in quadrants], axis=1), axis=1).astype(np.int64)
    return {"x": x[:num_samples], "y": y[:num_samples], "x_test": x[num_samples:], "y_test": y[num_samples:]}
