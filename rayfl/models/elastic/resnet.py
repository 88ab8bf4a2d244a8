"""Elastic pre-activation ResNet for 32x32 images (HeteroFL's ``src/models/resnet.py`` layout).

Stem: 3x3 conv (3 → widths[0]), no norm, no pooling. Stages of blocks; every block is pre-activation
(norm → act → conv), convs have no bias, a 1x1 projection shortcut reads the activated block input where a block changes
shape, and the head is norm → act → global average pool → linear. ResNet-18/34 use basic blocks, 50/101/152
bottlenecks (expansion 4).

Searchable dimensions:

* one per residual stream (``streamK``): the stem output and every tensor that reads or writes the residual stream
  until the next projection block share it, so any selector keeps the residual adds aligned;
* per block, its inner width(s): ``L.B.mid`` for a basic block (conv1's output), ``L.B.mid1`` and ``L.B.mid2`` for a
  bottleneck (conv1's and conv2's outputs). The first inner dimension of a block with an identity shortcut is
  skippable: 0 units remove the block (its branch adds nothing, so the block is exactly the identity). Projection
  blocks change the shape of the stream and are never skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rayfl.config import ResNetConfig
from rayfl.models.elastic.family import CostUnit, ElasticFamily, Scaler
from rayfl.models.elastic.space import Axis, Dimension, SearchSpace, TensorLayout

__all__ = ["STAGE_BLOCKS", "ElasticResNet", "ResNetFamily"]

STAGE_BLOCKS: dict[int, tuple[str, tuple[int, ...]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """Static shape of one block and the dimensions it uses (indices into the search space)."""

    prefix: str  # "layers.S.B."
    kind: str  # basic | bottleneck
    stride: int
    stream_in: int
    stream_out: int
    mids: tuple[int, ...]
    projection: bool
    resolution: int  # input height (= width) of the block


def make_norm(cfg: ResNetConfig, channels: int, track: bool) -> nn.Module:
    if cfg.norm == "bn":
        # Static BN: batch statistics in training; running statistics only in a server-side evaluation copy.
        return nn.BatchNorm2d(channels, momentum=None, track_running_stats=track)
    if cfg.norm == "gn":
        # GroupNorm needs groups | channels; a sub-model with fewer channels uses gcd(groups, channels) groups.
        return nn.GroupNorm(math.gcd(cfg.gn_groups, channels), channels)
    return nn.Identity()


def make_act(cfg_act: str) -> nn.Module:
    return nn.ReLU6(inplace=False) if cfg_act == "relu6" else nn.ReLU(inplace=False)


class PreActBlock(nn.Module):
    """Basic (two 3x3 convs) or bottleneck (1x1, 3x3, 1x1) pre-activation block at the given widths."""

    def __init__(
        self,
        cfg: ResNetConfig,
        kind: str,
        c_in: int,
        mids: Sequence[int],
        c_out: int,
        stride: int,
        projection: bool,
        rates: Sequence[float],
        track: bool,
    ) -> None:
        super().__init__()
        # rates: width rate of the tensor each norm sees (block input, then each mid)
        use_scaler = cfg.scaler
        widths = [c_in, *mids]
        if kind == "basic":
            convs = [nn.Conv2d(c_in, mids[0], 3, stride, 1, bias=False), nn.Conv2d(mids[0], c_out, 3, 1, 1, bias=False)]
        else:
            convs = [
                nn.Conv2d(c_in, mids[0], 1, 1, 0, bias=False),
                nn.Conv2d(mids[0], mids[1], 3, stride, 1, bias=False),
                nn.Conv2d(mids[1], c_out, 1, 1, 0, bias=False),
            ]
        for i, conv in enumerate(convs):
            self.add_module(f"n{i + 1}", make_norm(cfg, widths[i], track))
            self.add_module(f"s{i + 1}", Scaler(rates[i]) if use_scaler else nn.Identity())
            self.add_module(f"conv{i + 1}", conv)
        self.num_convs = len(convs)
        self.act = make_act(cfg.act)
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride, bias=False) if projection else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = self.get_submodule
        out = self.act(part("n1")(part("s1")(x)))
        short = self.shortcut(out) if self.shortcut is not None else x
        out = part("conv1")(out)
        for i in range(2, self.num_convs + 1):
            out = part(f"conv{i}")(self.act(part(f"n{i}")(part(f"s{i}")(out))))
        result: torch.Tensor = out + short
        return result


class ElasticResNet(nn.Module):
    def __init__(
        self,
        cfg: ResNetConfig,
        plans: Sequence[BlockPlan],
        units: Sequence[int],
        sizes: Sequence[int],
        in_channels: int,
        num_classes: int,
        track: bool,
    ) -> None:
        super().__init__()

        def rate(d: int) -> float:
            return units[d] / sizes[d]

        first = plans[0].stream_in
        self.conv1 = nn.Conv2d(in_channels, units[first], 3, 1, 1, bias=False)
        stages: dict[int, list[nn.Module]] = {}
        for p in plans:
            stage = int(p.prefix.split(".")[1])
            if units[p.mids[0]] == 0:
                stages.setdefault(stage, []).append(nn.Identity())  # skipped: keeps later blocks' names
                continue
            stages.setdefault(stage, []).append(
                PreActBlock(
                    cfg,
                    p.kind,
                    units[p.stream_in],
                    [units[m] for m in p.mids],
                    units[p.stream_out],
                    p.stride,
                    p.projection,
                    [rate(p.stream_in), *(rate(m) for m in p.mids)],
                    track,
                )
            )
        self.layers = nn.ModuleList(nn.Sequential(*stages[s]) for s in sorted(stages))
        last = plans[-1].stream_out
        self.n4 = make_norm(cfg, units[last], track)
        self.s4 = Scaler(rate(last)) if cfg.scaler else nn.Identity()
        self.act = make_act(cfg.act)
        self.linear = nn.Linear(units[last], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        for stage in self.layers:
            out = stage(out)
        out = self.act(self.n4(self.s4(out))).mean(dim=(2, 3))
        logits: torch.Tensor = self.linear(out)
        return logits


class ResNetFamily(ElasticFamily):
    """Search space and builder of the elastic ResNet (see module docstring)."""

    def __init__(self, cfg: ResNetConfig, in_channels: int = 3, num_classes: int = 10, image_size: int = 32) -> None:
        self.cfg = cfg
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.image_size = image_size
        kind, blocks = STAGE_BLOCKS[cfg.depth]
        if len(cfg.widths) != len(blocks):
            raise ValueError(f"model.widths needs {len(blocks)} stage widths for depth {cfg.depth}")
        expansion = 1 if kind == "basic" else 4
        dims: list[Dimension] = []
        layouts: dict[str, TensorLayout] = {}

        def new_dim(name: str, size: int, skippable: bool = False) -> int:
            dims.append(Dimension(name, size, skippable))
            return len(dims) - 1

        def lay(name: str, shape: tuple[int, ...], axes: tuple[Axis | None, ...], gate: int | None = None) -> None:
            layouts[name] = TensorLayout(shape, axes, gate)

        stream = new_dim("stream0", cfg.widths[0])
        lay("conv1.weight", (cfg.widths[0], in_channels, 3, 3), (Axis(stream), None, None, None))
        c_in, res = cfg.widths[0], image_size
        plans: list[BlockPlan] = []
        for s, (width, n_blocks) in enumerate(zip(cfg.widths, blocks, strict=True)):
            for b in range(n_blocks):
                stride = 2 if (s > 0 and b == 0) else 1
                c_out = width * expansion
                projection = stride != 1 or c_in != c_out
                prefix = f"layers.{s}.{b}."
                stream_in = stream
                stream_out = new_dim(f"stream{len(plans) + 1}", c_out) if projection else stream_in
                n_mids = 1 if kind == "basic" else 2
                names = ["mid"] if kind == "basic" else ["mid1", "mid2"]
                mids = tuple(
                    new_dim(f"{s}.{b}.{names[i]}", width, skippable=(i == 0 and not projection)) for i in range(n_mids)
                )
                gate = mids[0]
                ins = (stream_in, *mids)
                outs = (*mids, stream_out)
                ksizes = (3, 3) if kind == "basic" else (1, 3, 1)
                for i, k in enumerate(ksizes):
                    cin_size = dims[ins[i]].size
                    cout_size = dims[outs[i]].size
                    if cfg.norm != "none":
                        lay(f"{prefix}n{i + 1}.weight", (cin_size,), (Axis(ins[i]),), gate)
                        lay(f"{prefix}n{i + 1}.bias", (cin_size,), (Axis(ins[i]),), gate)
                    lay(
                        f"{prefix}conv{i + 1}.weight",
                        (cout_size, cin_size, k, k),
                        (Axis(outs[i]), Axis(ins[i]), None, None),
                        gate,
                    )
                if projection:
                    lay(
                        f"{prefix}shortcut.weight",
                        (c_out, c_in, 1, 1),
                        (Axis(stream_out), Axis(stream_in), None, None),
                        gate,
                    )
                plans.append(BlockPlan(prefix, kind, stride, stream_in, stream_out, mids, projection, res))
                stream, c_in = stream_out, c_out
                res = (res - 1) // stride + 1
        if cfg.norm != "none":
            lay("n4.weight", (c_in,), (Axis(stream),))
            lay("n4.bias", (c_in,), (Axis(stream),))
        lay("linear.weight", (num_classes, c_in), (None, Axis(stream)))
        lay("linear.bias", (num_classes,), (None,))
        self.plans = tuple(plans)
        self.space = SearchSpace(tuple(dims), layouts, classifier=("linear.weight", "linear.bias"))

    def cost_units(self) -> list[CostUnit]:
        cfg, res0 = self.cfg, self.image_size
        style = (cfg.norm, cfg.gn_groups, cfg.act, cfg.scaler)
        first = self.plans[0].stream_in

        def stem(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
            return nn.Conv2d(self.in_channels, w[0], 3, 1, 1, bias=False), _images(self.in_channels, res0, False)

        units = [CostUnit(("resnet_stem", self.in_channels, res0), (first,), None, stem)]
        for p in self.plans:
            dims = (p.stream_in, *p.mids) + ((p.stream_out,) if p.projection else ())

            def block(
                w: tuple[int, ...], p: BlockPlan = p
            ) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
                c_in, mids = w[0], w[1 : 1 + len(p.mids)]
                c_out = w[-1] if p.projection else c_in
                rates = [0.5] * (1 + len(mids))
                module = PreActBlock(cfg, p.kind, c_in, mids, c_out, p.stride, p.projection, rates, False)
                return module, _images(c_in, p.resolution, True)

            key = ("resnet_block", p.kind, p.stride, p.projection, p.resolution, style)
            units.append(CostUnit(key, dims, p.mids[0], block))
        last, res = self.plans[-1].stream_out, (self.plans[-1].resolution - 1) // self.plans[-1].stride + 1

        def head(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
            return _Head(cfg, w[0], self.num_classes), _images(w[0], res, True)

        units.append(CostUnit(("resnet_head", self.num_classes, res, style), (last,), None, head))
        return units

    def build(self, units: Sequence[int], track_stats: bool = False) -> nn.Module:
        """``track_stats``: BN keeps running statistics (the server's static-BN evaluation copy)."""
        return ElasticResNet(
            self.cfg, self.plans, units, self.space.sizes.tolist(), self.in_channels, self.num_classes, track_stats
        )


class _Head(nn.Module):
    """The head alone (norm → act → pool → linear), for the cost model."""

    def __init__(self, cfg: ResNetConfig, width: int, num_classes: int) -> None:
        super().__init__()
        self.n4 = make_norm(cfg, width, False)
        self.s4 = Scaler(0.5) if cfg.scaler else nn.Identity()
        self.act = make_act(cfg.act)
        self.linear = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(self.act(self.n4(self.s4(x))).mean(dim=(2, 3)))
        return out


def _images(channels: int, res: int, grad: bool) -> Callable[[int, torch.device], torch.Tensor]:
    def make(batch: int, device: torch.device) -> torch.Tensor:
        return torch.randn(batch, channels, res, res, device=device, requires_grad=grad)

    return make


def init_heterofl(model: nn.Module) -> None:
    """HeteroFL's ``init_param``: norm weight 1, bias 0; linear bias 0; conv/linear weights keep PyTorch's default."""
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
