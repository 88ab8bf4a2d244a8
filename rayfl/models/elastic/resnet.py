"""Elastic pre-activation ResNet for 32x32 images (HeteroFL's ``src/models/resnet.py`` layout).

Stem: 3x3 conv (3 → widths[0]), no norm, no pooling. Stages of blocks; every block is pre-activation
(norm → act → conv), convs have no bias, a 1x1 projection shortcut reads the activated block input where a block changes
shape, and the head is norm → act → global average pool → linear. ResNet-18/34 use basic blocks, 50/101/152
bottlenecks (expansion 4). ``head_pool: k`` > 1 averages over k x k equal windows instead of the whole map, and the
linear layer reads the k*k cells of every channel (channel-major, as the side head): a label that depends on where a
feature is (the synthetic data's block teacher) stays within the head's reach, which a global pool discards.

Searchable dimensions:

* one per residual stream (``streamK``): the stem output and every tensor that reads or writes the residual stream
  until the next projection block share it, so any selector keeps the residual adds aligned;
* per block, its inner width(s): ``L.B.mid`` for a basic block (conv1's output), ``L.B.mid1`` and ``L.B.mid2`` for a
  bottleneck (conv1's and conv2's outputs). The first inner dimension of a block with an identity shortcut is
  skippable: 0 units remove the block (its branch adds nothing, so the block is exactly the identity). Projection
  blocks change the shape of the stream and are never skipped.

**Side exit** (``side_exit: k``, FedHeN, paper 001; Shallow-Deep Networks, Kaya et al. 2019): an early-exit head
``side`` reads the residual stream after stage ``k``: mixed pooling (Lee et al. 2016: ``s·max + (1 - s)·avg`` over
``side_pool`` x ``side_pool`` equal windows, ``s = sigmoid(side.alpha)`` learned, starting at 1/2) and a linear layer
on the flattened pooled features. Its tensors sit beside the global model's, so "stages 1..k + side head" is an index
subset of the complex model (the paper's Assumption 2.1). One more dimension, ``deep`` (one unit, skippable), gates
everything after stage ``k``: the deep stages and the main head. At 0 units the sub-model is the simple model,
whose output is the side exit; the deep stages' blocks then gate on ``deep`` alone (their inner widths are not
skippable: a tensor has one gate). ``ElasticResNet.forward_exits`` returns every exit's logits of one pass, early
first; ``forward`` returns the last (the main head's, without computing the side head, when the model has it).
The pooling is written as reshapes plus ``max``/``mean`` over each window, so autograd keeps only the pooled values
and the arg-max indices, never the stage's output (which the next block keeps already): the cost model's sum over
pieces stays exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rayfl.config.model import ResNetConfig
from rayfl.models.elastic.family import CostUnit, ElasticFamily, Scaler
from rayfl.models.elastic.space import Axis, Dimension, SearchSpace, TensorLayout

__all__ = ["STAGE_BLOCKS", "ElasticResNet", "ResNetFamily", "SideHead", "SidePlan"]

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


@dataclass(frozen=True, slots=True)
class SidePlan:
    """Where the side exit sits: after stage ``after_stage`` (1-based), reading dimension ``stream`` at ``resolution``;
    ``deep`` is the dimension gating everything after it."""

    after_stage: int
    stream: int
    deep: int
    resolution: int
    pool: int


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


class SideHead(nn.Module):
    """The early exit: mixed max/average pooling to ``pool`` x ``pool`` windows, then a linear layer (module
    docstring). The input's height and width must be multiples of ``pool``."""

    def __init__(self, channels: int, pool: int, num_classes: int) -> None:
        super().__init__()
        self.pool = pool
        self.alpha = nn.Parameter(torch.zeros(1))  # sigmoid(0) = 1/2: max and average weigh the same at first
        self.linear = nn.Linear(channels * pool * pool, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        p = self.pool
        # (b, c, p, h/p, p, w/p) -> (b, c, p, p, window): a copy, which autograd does not keep
        windows = x.reshape(b, c, p, h // p, p, w // p).permute(0, 1, 2, 4, 3, 5).reshape(b, c, p, p, -1)
        share = torch.sigmoid(self.alpha)
        mixed = share * windows.max(dim=-1).values + (1.0 - share) * windows.mean(dim=-1)
        logits: torch.Tensor = self.linear(mixed.reshape(b, -1))  # channel-major: channel i owns p*p inputs
        return logits


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
        side: SidePlan | None = None,
    ) -> None:
        super().__init__()

        def rate(d: int) -> float:
            return units[d] / sizes[d]

        deep = side is None or units[side.deep] > 0
        self.side_after = 0 if side is None else side.after_stage  # 1-based stage the side exit reads; 0 = none
        first = plans[0].stream_in
        self.conv1 = nn.Conv2d(in_channels, units[first], 3, 1, 1, bias=False)
        stages: dict[int, list[nn.Module]] = {}
        for p in plans:
            stage = int(p.prefix.split(".")[1])
            if not deep and side is not None and stage >= side.after_stage:
                break  # the simple model ends at the side exit
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
        self.side = None if side is None else SideHead(units[side.stream], side.pool, num_classes)
        self.act = make_act(cfg.act)
        self.linear: nn.Linear | None = None
        if deep:
            last = plans[-1].stream_out
            self.n4 = make_norm(cfg, units[last], track)
            self.s4 = Scaler(rate(last)) if cfg.scaler else nn.Identity()
            self.linear = nn.Linear(units[last] * cfg.head_pool**2, num_classes)
        self.head_pool = cfg.head_pool

    def _run(self, x: torch.Tensor, with_side: bool) -> list[torch.Tensor]:
        exits: list[torch.Tensor] = []
        out = self.conv1(x)
        for i, stage in enumerate(self.layers):
            out = stage(out)
            if self.side is not None and i + 1 == self.side_after and (with_side or self.linear is None):
                exits.append(self.side(out))
        if self.linear is not None:
            exits.append(self.linear(grid_mean(self.act(self.n4(self.s4(out))), self.head_pool)))
        return exits

    def forward_exits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Logits of every exit this (sub-)model has, from one pass, early exits first."""
        return self._run(x, with_side=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, with_side=False)[-1]


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

        if cfg.exit_only and not cfg.side_exit:
            raise ValueError("model.exit_only needs model.side_exit (the stage whose side head ends the model)")
        if cfg.side_exit and not 1 <= cfg.side_exit < len(blocks):
            raise ValueError(
                f"model.side_exit must lie in [1, {len(blocks) - 1}] (a stage before the last), got {cfg.side_exit}"
            )
        side: SidePlan | None = None
        stream = new_dim("stream0", cfg.widths[0])
        lay("conv1.weight", (cfg.widths[0], in_channels, 3, 3), (Axis(stream), None, None, None))
        c_in, res = cfg.widths[0], image_size
        plans: list[BlockPlan] = []
        deep: int | None = None  # the dimension gating everything after the side exit
        for s, (width, n_blocks) in enumerate(zip(cfg.widths, blocks, strict=True)):
            if cfg.side_exit and s == cfg.side_exit:
                if res % cfg.side_pool:
                    _refuse_pool("side_pool", cfg.side_pool, f"the {res}x{res} maps after stage {cfg.side_exit}")
                deep = new_dim("deep", 1, skippable=True)
                side = SidePlan(cfg.side_exit, stream, deep, res, cfg.side_pool)
                pool_area = cfg.side_pool * cfg.side_pool
                lay("side.alpha", (1,), (None,))
                lay("side.linear.weight", (num_classes, c_in * pool_area), (None, Axis(stream, pool_area)))
                lay("side.linear.bias", (num_classes,), (None,))
            for b in range(n_blocks):
                stride = 2 if (s > 0 and b == 0) else 1
                c_out = width * expansion
                projection = stride != 1 or c_in != c_out
                prefix = f"layers.{s}.{b}."
                stream_in = stream
                stream_out = new_dim(f"stream{len(plans) + 1}", c_out) if projection else stream_in
                n_mids = 1 if kind == "basic" else 2
                names = ["mid"] if kind == "basic" else ["mid1", "mid2"]
                skippable = not projection and deep is None  # after the side exit a block gates on ``deep``
                mids = tuple(
                    new_dim(f"{s}.{b}.{names[i]}", width, skippable=(i == 0 and skippable)) for i in range(n_mids)
                )
                gate = mids[0] if deep is None else deep
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
            lay("n4.weight", (c_in,), (Axis(stream),), deep)
            lay("n4.bias", (c_in,), (Axis(stream),), deep)
        if res % cfg.head_pool:
            _refuse_pool("head_pool", cfg.head_pool, f"the {res}x{res} maps of the last stage")
        head_area = cfg.head_pool * cfg.head_pool
        lay("linear.weight", (num_classes, c_in * head_area), (None, Axis(stream, head_area)), deep)
        lay("linear.bias", (num_classes,), (None,), deep)
        self.plans = tuple(plans)
        self.side = side
        classifier = ("linear.weight", "linear.bias") + (("side.linear.weight", "side.linear.bias") if side else ())
        self.space = SearchSpace(tuple(dims), layouts, classifier=classifier)
        self.stage_sizes = blocks

    def stage_blocks(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Per stage, each block's inner dimensions (``mid`` or ``mid1, mid2``; the first removes the block)."""
        out: list[tuple[tuple[int, ...], ...]] = []
        start = 0
        for n in self.stage_sizes:
            out.append(tuple(plan.mids for plan in self.plans[start : start + n]))
            start += n
        return tuple(out)

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
            side = self.side
            if side is not None and p.prefix == f"layers.{side.after_stage}.0.":
                units.append(self._side_unit(side))  # the side head reads the stream the next stage starts from
            after_exit = side is not None and self.stage_of(p) >= side.after_stage
            units.append(CostUnit(key, dims, side.deep if side is not None and after_exit else p.mids[0], block))
        last, res = self.plans[-1].stream_out, (self.plans[-1].resolution - 1) // self.plans[-1].stride + 1

        def head(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
            return _Head(cfg, w[0], self.num_classes), _images(w[0], res, True)

        deep = None if self.side is None else self.side.deep
        pooled = () if cfg.head_pool == 1 else (cfg.head_pool,)  # keys of the default head as they always were
        units.append(CostUnit(("resnet_head", self.num_classes, res, style, *pooled), (last,), deep, head))
        return units

    @staticmethod
    def stage_of(plan: BlockPlan) -> int:
        """0-based stage of a block."""
        return int(plan.prefix.split(".")[1])

    def _side_unit(self, side: SidePlan) -> CostUnit:
        def make(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
            return SideHead(w[0], side.pool, self.num_classes), _images(w[0], side.resolution, True)

        return CostUnit(("resnet_side", self.num_classes, side.resolution, side.pool), (side.stream,), None, make)

    def side_exit_units(self) -> tuple[int, ...]:
        """The simple model: every dimension up to the side exit at full width, ``deep`` (and so every later tensor)
        at 0. Dimensions after the exit keep their sizes; no tensor of the sub-model reads them."""
        if self.side is None:
            raise ValueError("the simple model needs model.side_exit (a ResNet with a side exit): set model.side_exit")
        units = list(super().full_units)
        units[self.side.deep] = 0
        return tuple(units)

    @property
    def full_units(self) -> tuple[int, ...]:
        """Every dimension at its size; with ``exit_only`` the model ends at the side exit (``deep`` at 0), so the
        global model, its cost and its tensors are the simple model's."""
        return self.side_exit_units() if self.cfg.exit_only else super().full_units

    def build(self, units: Sequence[int], track_stats: bool = False) -> nn.Module:
        """``track_stats``: BN keeps running statistics (the server's static-BN evaluation copy)."""
        return ElasticResNet(
            self.cfg,
            self.plans,
            units,
            self.space.sizes.tolist(),
            self.in_channels,
            self.num_classes,
            track_stats,
            self.side,
        )


class _Head(nn.Module):
    """The head alone (norm → act → pool → linear), for the cost model."""

    def __init__(self, cfg: ResNetConfig, width: int, num_classes: int) -> None:
        super().__init__()
        self.n4 = make_norm(cfg, width, False)
        self.s4 = Scaler(0.5) if cfg.scaler else nn.Identity()
        self.act = make_act(cfg.act)
        self.pool = cfg.head_pool
        self.linear = nn.Linear(width * self.pool**2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(grid_mean(self.act(self.n4(self.s4(x))), self.pool))
        return out


def grid_mean(x: torch.Tensor, pool: int) -> torch.Tensor:
    """``(b, c, h, w)`` maps averaged over ``pool`` x ``pool`` equal windows, flattened channel-major to
    ``(b, c * pool * pool)``; ``pool`` 1 is the global average pool. Only reshapes and a mean: autograd keeps nothing
    of ``x`` (the head's cost is the activation's alone, as before)."""
    if pool == 1:
        return x.mean(dim=(2, 3))
    b, c, h, w = x.shape
    return x.reshape(b, c, pool, h // pool, pool, w // pool).mean(dim=(3, 5)).reshape(b, -1)


def _images(channels: int, res: int, grad: bool) -> Callable[[int, torch.device], torch.Tensor]:
    def make(batch: int, device: torch.device) -> torch.Tensor:
        return torch.randn(batch, channels, res, res, device=device, requires_grad=grad)

    return make


def _refuse_pool(key: str, value: int, maps: str) -> None:
    """A pooling grid that does not divide its maps: known only once the data's resolution is, so refused here as a
    config error (one line at the key's file line or override, as every other bad value)."""
    from rayfl.core.errors import ConfigError

    raise ConfigError(f"{value} must divide {maps} (the data's images set their size)", f"model.{key}")
