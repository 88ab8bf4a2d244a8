"""The architecture of a transformable network as data: a sequence of ops over named channel dimensions.

FedTrans (paper 002, Sec. 4.1) grows models by widening and deepening *cells*; here every weighted layer (a conv, a
depthwise conv or a linear layer) is a cell. A ``Graph`` lists the ops in execution order; each op reads the outputs
of earlier ops (``"input"`` is the image) and writes one value whose channel axis is bound to a named *dimension*.
Ops that must keep the same number of channels share a dimension: the producers of a residual stream (a ResNet
stage's stem or shortcut and every block's second conv), a depthwise conv and the channels it filters, a squeeze-and-
excitation gate and the features it scales. Widening a cell widens its output dimension, so every tensor on that
dimension changes together and residual adds stay aligned by construction (the "conflict" operators of the author
code, ALGORITHMS.md section 9, handled by sharing a dimension). Two dimensions are fixed: the image channels and the
classes.

Op names are stable across transformations (the module and tensor names are derived from them), so the same cell has
the same tensor names in every model of a FedTrans family: that is what soft aggregation and the cell-wise
similarity match on. ``build_graph`` makes the base architectures: HeteroFL's plain CNN, a small ResNet-18 and
MobileNetV3-small (torchvision's layer table; ``tests/unit/models/test_cellnet.py`` loads torchvision's weights
into it and compares outputs).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from rayfl.config.model import CellNetConfig

__all__ = [
    "CELL_KINDS",
    "CLASSES",
    "IMAGE",
    "INPUT",
    "Graph",
    "Op",
    "base_graph",
    "make_divisible",
]

INPUT = "input"  # the value name of the image batch
IMAGE = "image"  # the fixed dimension of the image channels
CLASSES = "classes"  # the fixed dimension of the logits
CELL_KINDS = ("conv", "dwconv", "linear")

OpKind = Literal["conv", "dwconv", "linear", "norm", "act", "maxpool", "gap", "flatten", "add", "mul", "dropout"]


@dataclass(frozen=True)
class Op:
    """One operation. ``dim`` is the channel dimension of its output; cells also name their input dimension.

    ``conv``: ``kernel`` x ``kernel``, padding ``kernel // 2``, ``stride``; ``dwconv``: the same with one filter per
    channel (``in_dim == dim``); ``linear`` reads 2-D features, ``group`` of them per channel of ``in_dim`` (a
    flattened ``p x p`` map: ``p * p``, channel-major). ``norm`` is ``norm_kind`` (batch or group, with ``groups``)
    over ``dim``; ``act`` applies ``act``; ``gap`` averages over space down to a ``kernel`` x ``kernel`` map; ``add``
    and ``mul`` combine their two inputs (``mul`` scales the first by the second, a squeeze-and-excitation gate)."""

    name: str
    kind: OpKind
    inputs: tuple[str, ...]
    dim: str
    in_dim: str = ""
    kernel: int = 1
    stride: int = 1
    bias: bool = True
    act: str = ""
    norm_kind: str = ""
    groups: int = 1
    eps: float = 1e-5
    momentum: float = 0.1
    p: float = 0.0
    group: int = 1

    @property
    def is_cell(self) -> bool:
        return self.kind in CELL_KINDS


@dataclass(frozen=True)
class Graph:
    """Ops in execution order (the last one gives the logits) and every dimension's size, in order of appearance."""

    ops: tuple[Op, ...]
    sizes: tuple[tuple[str, int], ...]
    image_size: int

    def size(self, dim: str) -> int:
        return dict(self.sizes)[dim]

    @property
    def free_dims(self) -> tuple[str, ...]:
        """The dimensions a transformation (or a sub-model) may resize: all but the image channels and classes."""
        return tuple(d for d, _ in self.sizes if d not in (IMAGE, CLASSES))

    @property
    def cells(self) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.is_cell)

    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no op named {name!r}")

    def consumers(self, value: str) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if value in op.inputs)

    def with_sizes(self, sizes: dict[str, int]) -> Graph:
        """The same ops with some dimensions resized (group norms keep at most ``gcd(groups, size)`` groups)."""
        new = tuple((d, sizes.get(d, s)) for d, s in self.sizes)
        return dataclasses.replace(self, sizes=new)

    def resolutions(self) -> dict[str, int]:
        """The spatial size of every value (1 after global pooling; 0 for 2-D features)."""
        res = {INPUT: self.image_size}
        for op in self.ops:
            r = res[op.inputs[0]]
            if op.kind in ("conv", "dwconv"):
                r = (r + 2 * (op.kernel // 2) - op.kernel) // op.stride + 1
            elif op.kind == "maxpool":
                r //= 2
            elif op.kind == "gap":
                r = op.kernel
            elif op.kind == "flatten":
                r = 0
            res[op.name] = r
        return res


def make_divisible(value: float, divisor: int = 8) -> int:
    """MobileNet's channel rounding: to the nearest multiple of ``divisor``, never below 90 % of ``value``."""
    out = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * value else out


class _Builder:
    """Appends ops and dimensions; each helper returns the name of the value it wrote."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        self.ops: list[Op] = []
        self.sizes: dict[str, int] = {IMAGE: in_channels}
        self.num_classes = num_classes
        self.dim_of = {INPUT: IMAGE}

    def _add(self, op: Op) -> str:
        self.ops.append(op)
        self.dim_of[op.name] = op.dim
        return op.name

    def new_dim(self, name: str, size: int) -> str:
        self.sizes[name] = size
        return name

    def conv(self, name: str, x: str, dim: str, kernel: int, stride: int = 1, bias: bool = True) -> str:
        return self._add(Op(name, "conv", (x,), dim, self.dim_of[x], kernel, stride, bias))

    def dwconv(self, name: str, x: str, kernel: int, stride: int, bias: bool = False) -> str:
        d = self.dim_of[x]
        return self._add(Op(name, "dwconv", (x,), d, d, kernel, stride, bias))

    def linear(self, name: str, x: str, dim: str, group: int = 1) -> str:
        return self._add(Op(name, "linear", (x,), dim, self.dim_of[x], group=group))

    def norm(self, name: str, x: str, kind: str, eps: float = 1e-5, momentum: float = 0.1) -> str:
        d = self.dim_of[x]
        groups = math.gcd(4, self.sizes[d]) if kind == "group" else 1
        return self._add(Op(name, "norm", (x,), d, norm_kind=kind, groups=groups, eps=eps, momentum=momentum))

    def unary(self, name: str, x: str, kind: OpKind, act: str = "", p: float = 0.0) -> str:
        return self._add(Op(name, kind, (x,), self.dim_of[x], act=act, p=p))

    def binary(self, name: str, a: str, b: str, kind: OpKind) -> str:
        if self.dim_of[a] != self.dim_of[b]:
            raise ValueError(f"{name}: {kind} of values on dimensions {self.dim_of[a]} and {self.dim_of[b]}")
        return self._add(Op(name, kind, (a, b), self.dim_of[a]))

    def block(self, prefix: str, x: str, dim: str, kernel: int, stride: int, norm: str, act: str, **bn: float) -> str:
        """conv → norm → act (no norm when ``norm`` is ``none``: the conv keeps its bias)."""
        y = self.conv(prefix, x, dim, kernel, stride, bias=norm == "none")
        if norm != "none":
            y = self.norm(f"{prefix}_n", y, norm, **bn)
        return self.unary(f"{prefix}_a", y, "act", act=act) if act else y

    def head(self, x: str, pool: int) -> str:
        """Average pooling to ``pool`` x ``pool`` (1: global), flatten, linear classifier."""
        self.sizes[CLASSES] = self.num_classes
        pooled = self._add(Op("gap", "gap", (x,), self.dim_of[x], kernel=pool))
        return self.linear("head", self.unary("flatten", pooled, "flatten"), CLASSES, group=pool * pool)

    def graph(self, image_size: int) -> Graph:
        return Graph(tuple(self.ops), tuple(self.sizes.items()), image_size)


def _cnn(cfg: CellNetConfig, b: _Builder) -> str:
    """HeteroFL's conv net: conv 3x3 → norm → ReLU → max-pool per width (no pool after the last)."""
    x = INPUT
    widths = cfg.channels or (16, 32, 64)
    for i, width in enumerate(widths):
        dim = b.new_dim(f"c{i + 1}", width)
        x = b.conv(f"c{i + 1}", x, dim, 3, bias=True)
        if cfg.norm != "none":
            x = b.norm(f"c{i + 1}_n", x, cfg.norm)
        x = b.unary(f"c{i + 1}_a", x, "act", act="relu")
        if i < len(widths) - 1:
            x = b.unary(f"c{i + 1}_p", x, "maxpool")
    return b.head(x, cfg.head_pool)


def _resnet(cfg: CellNetConfig, b: _Builder) -> str:
    """A small ResNet-18 for 32x32 images: 3x3 stem, basic blocks (``blocks`` per stage), 1x1 projection shortcuts
    where the stride or width changes, global pooling and a linear classifier."""
    widths = cfg.channels or (16, 32, 64, 128)
    stream = b.new_dim("s1", widths[0])
    x = b.block("stem", INPUT, stream, 3, 1, cfg.norm, "relu")
    for s, (width, count) in enumerate(zip(widths, cfg.blocks, strict=True)):
        out = stream if s == 0 else b.new_dim(f"s{s + 1}", width)
        for k in range(count):
            p = f"s{s + 1}b{k + 1}"
            stride = 2 if s > 0 and k == 0 else 1
            h = b.block(f"{p}c1", x, b.new_dim(f"{p}", width), 3, stride, cfg.norm, "relu")
            h = b.block(f"{p}c2", h, out, 3, 1, cfg.norm, "")
            short = x if b.dim_of[x] == out and stride == 1 else b.block(f"{p}sc", x, out, 1, stride, cfg.norm, "")
            x = b.unary(f"{p}_a", b.binary(f"{p}_add", h, short, "add"), "act", act="relu")
        stream = out
    return b.head(x, cfg.head_pool)


# MobileNetV3-small (Howard et al. 2019, Table 2; torchvision's ``mobilenet_v3_small``): per inverted residual block
# kernel, expanded width, output width, squeeze-and-excitation, hard-swish, stride
_MOBILENET_V3_SMALL = (
    (3, 16, 16, True, False, 2),
    (3, 72, 24, False, False, 2),
    (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2),
    (5, 240, 40, True, True, 1),
    (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1),
    (5, 144, 48, True, True, 1),
    (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1),
    (5, 576, 96, True, True, 1),
)


# A CPU-sized MobileNetV3-small shape (issue 24: FedTrans's CIFAR-10 start at the size of rayfl's CPU settings): the
# same kinds of block (expansion, depthwise, squeeze-and-excitation, hard-swish, residual projection), fewer and
# narrower; 15 candidate cells besides the classifier
_MOBILENET_TINY = (
    (3, 16, 8, True, False, 2),
    (3, 24, 12, False, False, 2),
    (3, 32, 12, True, True, 1),
)


def _inverted_residuals(
    b: _Builder, x: str, table: tuple[tuple[int, int, int, bool, bool, int], ...], bn: dict[str, float]
) -> str:
    """MobileNetV3's inverted residual blocks ``b1``, ``b2``, ... after value ``x`` (kernel, expanded width, output
    width, squeeze-and-excitation, hard-swish, stride per block)."""
    for i, (kernel, expanded, width, se, hs, stride) in enumerate(table):
        p, act = f"b{i + 1}", "hardswish" if hs else "relu"
        h = x
        if expanded != b.sizes[b.dim_of[x]]:
            h = b.block(f"{p}e", x, b.new_dim(f"{p}e", expanded), 1, 1, "batch", act, **bn)
        h = b.dwconv(f"{p}dw", h, kernel, stride)
        h = b.unary(f"{p}dw_a", b.norm(f"{p}dw_n", h, "batch", **bn), "act", act=act)
        if se:
            squeeze = b.new_dim(f"{p}se", make_divisible(expanded // 4))
            g = b.conv(f"{p}se1", b.unary(f"{p}se_p", h, "gap"), squeeze, 1)
            g = b.conv(f"{p}se2", b.unary(f"{p}se_a", g, "act", act="relu"), b.dim_of[h], 1)
            h = b.binary(f"{p}se_m", h, b.unary(f"{p}se_g", g, "act", act="hardsigmoid"), "mul")
        residual = stride == 1 and b.sizes[b.dim_of[x]] == width
        out = b.dim_of[x] if residual else b.new_dim(f"{p}", width)
        h = b.block(f"{p}p", h, out, 1, 1, "batch", "", **bn)
        x = b.binary(f"{p}_add", h, x, "add") if residual else h
    return x


def _mobilenet_v3_small(cfg: CellNetConfig, b: _Builder) -> str:
    """torchvision's MobileNetV3-small: batch norms with eps 1e-3 and momentum 0.01, dropout 0.2 in the classifier."""
    bn = {"eps": 1e-3, "momentum": 0.01}
    x = b.block("stem", INPUT, b.new_dim("stem", 16), 3, 2, "batch", "hardswish", **bn)
    x = _inverted_residuals(b, x, _MOBILENET_V3_SMALL, bn)
    x = b.block("last", x, b.new_dim("last", 576), 1, 1, "batch", "hardswish", **bn)
    x = b.unary("flatten", b.unary("gap", x, "gap"), "flatten")
    x = b.unary("fc_a", b.linear("fc", x, b.new_dim("fc", 1024)), "act", act="hardswish")
    b.sizes[CLASSES] = b.num_classes
    return b.linear("head", b.unary("fc_drop", x, "dropout", p=0.2), CLASSES)


def _mobilenet_tiny(cfg: CellNetConfig, b: _Builder) -> str:
    """``_MOBILENET_TINY``: a stride-2 stem of 8 channels, three inverted residual blocks, a 1 x 1 conv to 32 channels
    with hard-swish, pooling to ``head_pool`` and the classifier (MobileNetV3-small's shape at CPU size)."""
    bn = {"eps": 1e-3, "momentum": 0.01}
    x = b.block("stem", INPUT, b.new_dim("stem", 8), 3, 2, "batch", "hardswish", **bn)
    x = _inverted_residuals(b, x, _MOBILENET_TINY, bn)
    x = b.block("last", x, b.new_dim("last", 32), 1, 1, "batch", "hardswish", **bn)
    return b.head(x, cfg.head_pool)


def _nb201_cell(b: _Builder, prefix: str, x: str) -> str:
    """NAS-Bench-201's cell as a fixed DAG of ReLU-conv-BN edges over four nodes on ``x``'s dimension: node 1 = 3 x 3
    of node 0; node 2 = 1 x 1 of node 0 + 3 x 3 of node 1; node 3 = node 0 (skip) + 1 x 1 of node 1 + 3 x 3 of node 2.
    Every edge writes the cell's dimension (they are summed)."""
    dim = b.dim_of[x]

    def edge(name: str, value: str, kernel: int) -> str:
        h = b.unary(f"{name}_a", value, "act", act="relu")
        return b.norm(f"{name}_n", b.conv(name, h, dim, kernel, bias=False), "batch")

    n1 = edge(f"{prefix}e01", x, 3)
    n2 = b.binary(f"{prefix}n2", edge(f"{prefix}e02", x, 1), edge(f"{prefix}e12", n1, 3), "add")
    n3 = b.binary(f"{prefix}n3a", x, edge(f"{prefix}e13", n1, 1), "add")
    return b.binary(f"{prefix}n3", n3, edge(f"{prefix}e23", n2, 3), "add")


def _nb201(cfg: CellNetConfig, b: _Builder) -> str:
    """A CPU-sized NAS-Bench-201 base network (Dong & Yang, ICLR 2020): a 3 x 3 conv stem, then per stage of
    ``channels`` (default 4-8) one cell (``_nb201_cell``), a residual reduction block (ReLU-conv 3 x 3 stride 2-BN,
    ReLU-conv 3 x 3-BN, a 1 x 1 stride-2 shortcut) between stages, BN-ReLU, pooling to ``head_pool`` and the
    classifier; 7 candidate cells per stage besides the classifier (each stage's cell edges share a width)."""
    widths = cfg.channels or (4, 8)
    x = b.norm("stem_n", b.conv("stem", INPUT, b.new_dim("s1", widths[0]), 3, bias=False), "batch")
    for s, width in enumerate(widths):
        if s > 0:
            p = f"r{s + 1}"
            out = b.new_dim(f"s{s + 1}", width)
            h = b.conv(f"{p}c1", b.unary(f"{p}c1_a", x, "act", act="relu"), out, 3, 2, bias=False)
            h = b.norm(f"{p}c1_n", h, "batch")
            h = b.norm(
                f"{p}c2_n", b.conv(f"{p}c2", b.unary(f"{p}c2_a", h, "act", act="relu"), out, 3, bias=False), "batch"
            )
            short = b.conv(f"{p}sc", x, out, 1, 2, bias=False)
            x = b.binary(f"{p}_add", h, short, "add")
        x = _nb201_cell(b, f"c{s + 1}", x)
    x = b.unary("last_a", b.norm("last_n", x, "batch"), "act", act="relu")
    return b.head(x, cfg.head_pool)


_BASES = {
    "cnn": _cnn,
    "resnet": _resnet,
    "mobilenet_v3_small": _mobilenet_v3_small,
    "mobilenet_tiny": _mobilenet_tiny,
    "nb201": _nb201,
}


def base_graph(cfg: CellNetConfig, in_channels: int, num_classes: int, image_size: int) -> Graph:
    """The untransformed architecture of ``cfg.base``."""
    builder = _Builder(in_channels, num_classes)
    _BASES[cfg.base](cfg, builder)
    return builder.graph(image_size)
