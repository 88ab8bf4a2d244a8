"""Elastic plain CNNs: HeteroFL's conv net (``src/models/conv.py``) and LEAF's FEMNIST CNN.

``HeteroCNNFamily``: per width in ``cfg.channels`` a block 3x3 conv (with bias) → ``Scaler`` → norm → ReLU, a 2x2
max-pool between blocks (not after the last), global average pooling and a linear classifier (the scalers hold no
state; the full-width model is HeteroFL's conv net, and ``model.name: cnn``'s global model). One dimension per conv
output (``conv1`` .. ``convN``); none is skippable, since removing a conv changes the stream. Index rules
(ALGORITHMS.md section 1, plain conv model): each conv's weight rows, its bias and the norm after it follow that
conv's output set, its columns the previous conv's; the classifier keeps all classes.

``FemnistCNNFamily``: conv5x5(32, pad 2) → ReLU → pool → conv5x5(64, pad 2) → ReLU → pool → flatten → dense 2048 →
ReLU → dense classes (6,603,710 parameters for 62 classes). Dimensions ``conv1``, ``conv2``, ``fc1``. The flattened
input of ``fc1`` is channel-major, so conv2 channel ``c`` owns the ``r * r`` consecutive columns starting at
``c * r * r`` (``r`` = the resolution after the second pool, 7 for 28x28 images): ``Axis(conv2, group=r * r)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from rayfl.config.model import CNNConfig, FemnistCNNConfig
from rayfl.models.elastic.family import CostUnit, ElasticFamily, Scaler
from rayfl.models.elastic.space import Axis, Dimension, SearchSpace, TensorLayout

__all__ = ["ElasticCNN", "ElasticFemnistCNN", "FemnistCNNFamily", "HeteroCNNFamily"]

_GN_GROUPS = 4  # GroupNorm groups (gcd with the width for narrower sub-models)
_MakeInput = Callable[[int, torch.device], torch.Tensor]


def make_norm(kind: str, channels: int, track: bool) -> nn.Module:
    """``batch``: HeteroFL's static BN (batch statistics; running statistics only in the server's evaluation copy).
    ``group``: GroupNorm with ``gcd(4, channels)`` groups, i.e. ``CNN``'s 4 groups whenever 4 divides the width, and
    still valid for sub-model widths that 4 does not divide."""
    if kind == "batch":
        return nn.BatchNorm2d(channels, momentum=None, track_running_stats=track)
    if kind == "group":
        return nn.GroupNorm(math.gcd(_GN_GROUPS, channels), channels)
    return nn.Identity()


def _scaler(use: bool, rate: float) -> nn.Module:
    return Scaler(rate) if use else nn.Identity()


def _images(channels: int, res: int, grad: bool) -> _MakeInput:
    def make(batch: int, device: torch.device) -> torch.Tensor:
        return torch.randn(batch, channels, res, res, device=device, requires_grad=grad)

    return make


# ---------------------------------------------------------------------------------------------- HeteroFL conv
class ElasticCNN(nn.Module):
    """HeteroFL's conv net at the given widths, with ``CNN``'s tensor names (``features.J``, ``head``).

    ``features`` holds the same modules at the same positions as ``CNN.features``; the scalers live in their own
    stateless ``scalers`` list and are applied right after each conv, so every state-dict name is ``CNN``'s.
    """

    def __init__(
        self,
        widths: Sequence[int],
        rates: Sequence[float],
        in_channels: int,
        num_classes: int,
        norm: str,
        scaler: bool,
        track: bool = False,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev = in_channels
        for i, width in enumerate(widths):
            layers += [nn.Conv2d(prev, width, 3, padding=1), make_norm(norm, width, track), nn.ReLU()]
            if i < len(widths) - 1:
                layers.append(nn.MaxPool2d(2))
            prev = width
        self.features = nn.Sequential(*layers)
        self.scalers = nn.ModuleList(_scaler(scaler, r) for r in rates)
        self.head = nn.Linear(prev, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = 0
        for layer in self.features:
            x = layer(x)
            if isinstance(layer, nn.Conv2d):
                x = self.scalers[k](x)
                k += 1
        logits: torch.Tensor = self.head(x.mean(dim=(2, 3)))
        return logits


class _CNNHead(nn.Module):
    """Global average pool → linear, alone (cost piece). Saves only the pooled features, never its input."""

    def __init__(self, width: int, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(x.mean(dim=(2, 3)))
        return out


class HeteroCNNFamily(ElasticFamily):
    """Search space and builder of HeteroFL's elastic conv net (see module docstring).

    ``scaler``: HeteroFL's divide-by-width-rate after every conv (training only); ``None`` reads ``cfg.scaler`` when
    the config has such a field and is ``True`` otherwise. ``image_size`` only matters for the cost pieces.
    """

    def __init__(
        self,
        cfg: CNNConfig,
        in_channels: int = 3,
        num_classes: int = 10,
        *,
        image_size: int = 32,
        scaler: bool | None = None,
    ) -> None:
        if not cfg.channels:
            raise ValueError("model.channels needs at least one conv width")
        self.cfg = cfg
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.image_size = image_size
        self.scaler = bool(getattr(cfg, "scaler", True)) if scaler is None else scaler
        dims = tuple(Dimension(f"conv{i + 1}", w) for i, w in enumerate(cfg.channels))
        layouts: dict[str, TensorLayout] = {}
        j, prev, prev_axis = 0, in_channels, None
        for d, width in enumerate(cfg.channels):
            out = Axis(d)
            layouts[f"features.{j}.weight"] = TensorLayout((width, prev, 3, 3), (out, prev_axis, None, None))
            layouts[f"features.{j}.bias"] = TensorLayout((width,), (out,))
            if cfg.norm != "none":
                layouts[f"features.{j + 1}.weight"] = TensorLayout((width,), (out,))
                layouts[f"features.{j + 1}.bias"] = TensorLayout((width,), (out,))
            j += 4 if d < len(cfg.channels) - 1 else 3  # conv, norm, relu[, pool]
            prev, prev_axis = width, out
        layouts["head.weight"] = TensorLayout((num_classes, prev), (None, prev_axis))
        layouts["head.bias"] = TensorLayout((num_classes,), (None,))
        self.space = SearchSpace(dims, layouts, classifier=("head.weight", "head.bias"))

    def build(self, units: Sequence[int], track_stats: bool = False) -> nn.Module:
        """``track_stats``: BN keeps running statistics (the server's static-BN evaluation copy)."""
        rates = [u / d.size for u, d in zip(units, self.space.dims, strict=True)]
        return ElasticCNN(
            list(units), rates, self.in_channels, self.num_classes, self.cfg.norm, self.scaler, track_stats
        )

    def cost_units(self) -> list[CostUnit]:
        """One piece per block (conv → scaler → norm → ReLU → pool: the ReLU output is the pool's input, so both stay
        in one piece; the pool does not save its output, the next conv's input), then pool + linear."""
        norm, scaler, n = self.cfg.norm, self.scaler, len(self.cfg.channels)
        style = (norm, _GN_GROUPS, scaler)
        units: list[CostUnit] = []
        res = self.image_size
        for d in range(n):
            pool = d < n - 1
            first = d == 0

            def block(
                w: tuple[int, ...], res: int = res, pool: bool = pool, first: bool = first
            ) -> tuple[nn.Module, _MakeInput]:
                c_in = self.in_channels if first else w[0]
                c_out = w[-1]
                layers = [nn.Conv2d(c_in, c_out, 3, padding=1), _scaler(scaler, 0.5), make_norm(norm, c_out, False)]
                layers += [nn.ReLU(), nn.MaxPool2d(2)] if pool else [nn.ReLU()]
                return nn.Sequential(*layers), _images(c_in, res, not first)

            if first:
                units.append(CostUnit(("hetero_cnn_stem", self.in_channels, res, pool, style), (d,), None, block))
            else:
                units.append(CostUnit(("hetero_cnn_block", res, pool, style), (d - 1, d), None, block))
            if pool:
                res //= 2
        classes = self.num_classes

        def head(w: tuple[int, ...], res: int = res) -> tuple[nn.Module, _MakeInput]:
            return _CNNHead(w[0], classes), _images(w[0], res, True)

        units.append(CostUnit(("hetero_cnn_head", classes, res), (n - 1,), None, head))
        return units


# ---------------------------------------------------------------------------------------------- LEAF FEMNIST
class ElasticFemnistCNN(nn.Module):
    """LEAF's FEMNIST CNN at the given widths; ``s1``..``s3`` are HeteroFL scalers (or identities) after each hidden
    layer."""

    def __init__(
        self,
        units: Sequence[int],
        rates: Sequence[float],
        in_channels: int,
        num_classes: int,
        flat_group: int,
        scaler: bool,
    ) -> None:
        super().__init__()
        c1, c2, hidden = units
        self.conv1 = nn.Conv2d(in_channels, c1, 5, padding=2)
        self.s1 = _scaler(scaler, rates[0])
        self.conv2 = nn.Conv2d(c1, c2, 5, padding=2)
        self.s2 = _scaler(scaler, rates[1])
        self.fc1 = nn.Linear(c2 * flat_group, hidden)
        self.s3 = _scaler(scaler, rates[2])
        self.fc2 = nn.Linear(hidden, num_classes)
        self.act = nn.ReLU()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.act(self.s1(self.conv1(x))))
        x = self.pool(self.act(self.s2(self.conv2(x))))
        x = self.act(self.s3(self.fc1(x.flatten(1))))
        logits: torch.Tensor = self.fc2(x)
        return logits


class FemnistCNNFamily(ElasticFamily):
    """Search space and builder of the elastic LEAF FEMNIST CNN (see module docstring).

    ``scaler``: HeteroFL scalers after conv1, conv2 and fc1; off by default (LEAF's model has none).
    """

    def __init__(
        self,
        cfg: FemnistCNNConfig,
        in_channels: int = 1,
        num_classes: int = 62,
        image_size: int = 28,
        *,
        scaler: bool = False,
    ) -> None:
        self.cfg = cfg
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.image_size = image_size
        self.scaler = scaler
        self.flat_res = image_size // 2 // 2
        if self.flat_res < 1:
            raise ValueError(f"femnist_cnn needs images of at least 4x4 pixels, got {image_size}")
        group = self.flat_res * self.flat_res
        self.flat_group = group
        c1, c2 = cfg.channels
        hidden = cfg.hidden
        dims = (Dimension("conv1", c1), Dimension("conv2", c2), Dimension("fc1", hidden))
        a1, a2, a3 = Axis(0), Axis(1), Axis(2)
        layouts = {
            "conv1.weight": TensorLayout((c1, in_channels, 5, 5), (a1, None, None, None)),
            "conv1.bias": TensorLayout((c1,), (a1,)),
            "conv2.weight": TensorLayout((c2, c1, 5, 5), (a2, a1, None, None)),
            "conv2.bias": TensorLayout((c2,), (a2,)),
            "fc1.weight": TensorLayout((hidden, c2 * group), (a3, Axis(1, group=group))),
            "fc1.bias": TensorLayout((hidden,), (a3,)),
            "fc2.weight": TensorLayout((num_classes, hidden), (None, a3)),
            "fc2.bias": TensorLayout((num_classes,), (None,)),
        }
        self.space = SearchSpace(dims, layouts, classifier=("fc2.weight", "fc2.bias"))

    def build(self, units: Sequence[int]) -> nn.Module:
        rates = [u / d.size for u, d in zip(units, self.space.dims, strict=True)]
        return ElasticFemnistCNN(list(units), rates, self.in_channels, self.num_classes, self.flat_group, self.scaler)

    def cost_units(self) -> list[CostUnit]:
        """conv1 block, conv2 block (conv → scaler → ReLU → pool each), fc1 (flatten → linear → scaler), head (ReLU →
        linear): fc1 ends before its ReLU, whose saved output is also fc2's saved input, so one piece owns it."""
        cin, res, flat, scaler = self.in_channels, self.image_size, self.flat_res, self.scaler
        res2 = res // 2
        classes = self.num_classes

        def conv1(w: tuple[int, ...]) -> tuple[nn.Module, _MakeInput]:
            layers = [nn.Conv2d(cin, w[0], 5, padding=2), _scaler(scaler, 0.5), nn.ReLU(), nn.MaxPool2d(2)]
            return nn.Sequential(*layers), _images(cin, res, False)

        def conv2(w: tuple[int, ...]) -> tuple[nn.Module, _MakeInput]:
            layers = [nn.Conv2d(w[0], w[1], 5, padding=2), _scaler(scaler, 0.5), nn.ReLU(), nn.MaxPool2d(2)]
            return nn.Sequential(*layers), _images(w[0], res2, True)

        def fc1(w: tuple[int, ...]) -> tuple[nn.Module, _MakeInput]:
            layers = [nn.Flatten(), nn.Linear(w[0] * flat * flat, w[1]), _scaler(scaler, 0.5)]
            return nn.Sequential(*layers), _images(w[0], flat, True)

        def head(w: tuple[int, ...]) -> tuple[nn.Module, _MakeInput]:
            def make(batch: int, device: torch.device) -> torch.Tensor:
                return torch.randn(batch, w[0], device=device, requires_grad=True)

            return nn.Sequential(nn.ReLU(), nn.Linear(w[0], classes)), make

        return [
            CostUnit(("femnist_cnn_conv1", cin, res, scaler), (0,), None, conv1),
            CostUnit(("femnist_cnn_conv2", res2, scaler), (0, 1), None, conv2),
            CostUnit(("femnist_cnn_fc1", flat, scaler), (1, 2), None, fc1),
            CostUnit(("femnist_cnn_head", classes), (2,), None, head),
        ]
