"""HeteroFL's convolutional network for 32x32 images (Diao et al., ICLR 2021, ``src/models/conv.py`` layout).

Blocks of 3x3 conv → norm → ReLU, a 2x2 max-pool between blocks, global average pooling and a linear classifier.
"""

from __future__ import annotations

import torch
from torch import nn

from rayfl.config import CNNConfig

__all__ = ["CNN"]


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        # HeteroFL's static BN: statistics are not tracked across clients.
        return nn.BatchNorm2d(channels, momentum=None, track_running_stats=False)
    if kind == "group":
        return nn.GroupNorm(min(4, channels), channels)
    return nn.Identity()


class CNN(nn.Module):
    """Conv net with configurable stage widths; ``channels=(64, 128, 256, 512)`` is HeteroFL's."""

    def __init__(self, cfg: CNNConfig, in_channels: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev = in_channels
        for i, width in enumerate(cfg.channels):
            layers += [nn.Conv2d(prev, width, 3, padding=1), _norm(cfg.norm, width), nn.ReLU(inplace=True)]
            if i < len(cfg.channels) - 1:
                layers.append(nn.MaxPool2d(2))
            prev = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(prev, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x).mean(dim=(2, 3))
        logits: torch.Tensor = self.head(h)
        return logits
