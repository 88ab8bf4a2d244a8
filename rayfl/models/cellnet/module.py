"""A transformable network as a PyTorch module, and its elastic family (sub-models for HeteroFL-style baselines).

``CellNet`` runs a ``Graph``: one module per op in a ``ModuleDict`` named by the op, so tensor names are
``layers.<op>.weight`` and stay the same in every model of a FedTrans family. ``CellNetFamily`` makes any
architecture an ``ElasticFamily`` too: one search dimension per free graph dimension, so HeteroFL and FedAvg can train
the largest model FedTrans produced (paper 002's protocol for its baselines), with the cost model's pieces read off
the graph (one piece per op).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from rayfl.config.model import CellNetConfig
from rayfl.models.cellnet.graph import CLASSES, IMAGE, INPUT, Graph, Op
from rayfl.models.cellnet.transform import build_graph, op_tensors, tensor_name
from rayfl.models.elastic.family import CostUnit, ElasticFamily, Scaler
from rayfl.models.elastic.space import Axis, Dimension, SearchSpace, TensorLayout

__all__ = ["CellNet", "CellNetFamily"]

_ACTS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "relu6": nn.ReLU6,
    "hardswish": nn.Hardswish,
    "hardsigmoid": nn.Hardsigmoid,
}
_MakeInput = Callable[[int, torch.device], torch.Tensor]


def _layer(op: Op, graph: Graph, track_stats: bool) -> nn.Module | None:
    """The module of one op at the graph's sizes (``None`` for adds and products, computed inline)."""
    c = graph.size(op.dim)
    if op.kind == "conv":
        cin = graph.size(op.in_dim)
        return nn.Conv2d(cin, c, op.kernel, op.stride, op.kernel // 2, bias=op.bias)
    if op.kind == "dwconv":
        return nn.Conv2d(c, c, op.kernel, op.stride, op.kernel // 2, groups=c, bias=op.bias)
    if op.kind == "linear":
        return nn.Linear(graph.size(op.in_dim) * op.group, c, bias=op.bias)
    if op.kind == "norm":
        if op.norm_kind == "group":
            return nn.GroupNorm(math.gcd(op.groups, c), c)
        norm = nn.BatchNorm2d(c, eps=op.eps, momentum=op.momentum, track_running_stats=track_stats)
        if norm.num_batches_tracked is not None:
            # the running statistics move by ``momentum``, so the batch counter is never read: kept out of the state,
            # a model's state is floating tensors only, which is all the engine sends, loads and aggregates
            norm.register_buffer("num_batches_tracked", norm.num_batches_tracked, persistent=False)
        return norm
    if op.kind == "act":
        return _ACTS[op.act]()
    if op.kind == "maxpool":
        return nn.MaxPool2d(2)
    if op.kind == "gap":
        return nn.AdaptiveAvgPool2d(op.kernel)
    if op.kind == "flatten":
        return nn.Flatten()
    if op.kind == "dropout":
        return nn.Dropout(op.p)
    return None


class CellNet(nn.Module):
    """Runs ``graph``; ``rates`` (HeteroFL's scaler): each cell's output divided by its dimension's width rate in
    training, for the cells whose rate is below 1 (the classifier is never scaled)."""

    def __init__(self, graph: Graph, rates: Mapping[str, float] | None = None, track_stats: bool = True) -> None:
        super().__init__()
        self.graph = graph
        self.layers = nn.ModuleDict()
        self.scalers = nn.ModuleDict()
        for op in graph.ops:
            layer = _layer(op, graph, track_stats)
            if layer is not None:
                self.layers[op.name] = layer
            rate = (rates or {}).get(op.dim, 1.0)
            if op.is_cell and op.dim != CLASSES and rate < 1.0:
                self.scalers[op.name] = Scaler(rate)
        # a value is dropped once its last reader has run (only autograd keeps what backward needs)
        last: dict[str, int] = {}
        for i, op in enumerate(graph.ops):
            for value in op.inputs:
                last[value] = i
        self._drop_after = [tuple(v for v in op.inputs if last[v] == i) for i, op in enumerate(graph.ops)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = {INPUT: x}
        out = x
        for op, done in zip(self.graph.ops, self._drop_after, strict=True):
            if op.kind == "add":
                out = values[op.inputs[0]] + values[op.inputs[1]]
            elif op.kind == "mul":
                out = values[op.inputs[0]] * values[op.inputs[1]]
            else:
                out = self.layers[op.name](values[op.inputs[0]])
                if op.name in self.scalers:
                    out = self.scalers[op.name](out)
            values[op.name] = out
            for value in done:
                del values[value]
        return out


class CellNetFamily(ElasticFamily):
    """The elastic family of a cellnet architecture: one dimension per free graph dimension (none skippable).

    Every tensor's axes follow the op's dimensions: a conv's rows its output dimension and its columns its input
    dimension, a depthwise conv's filters and every norm vector their dimension; image channels and classes are never
    sliced. The classifier is the last op (HeteroFL's label masking restricts its rows)."""

    def __init__(self, cfg: CellNetConfig, in_channels: int, num_classes: int, image_size: int) -> None:
        self.cfg = cfg
        self.graph = build_graph(cfg, in_channels, num_classes, image_size)
        names = self.graph.free_dims
        self._index = {d: i for i, d in enumerate(names)}
        dims = tuple(Dimension(d, self.graph.size(d)) for d in names)
        layouts: dict[str, TensorLayout] = {}
        for op in self.graph.ops:
            for tensor in op_tensors(op):
                layouts[tensor_name(op.name, tensor)] = self._layout(op, tensor)
        last = self.graph.ops[-1]
        classifier = tuple(tensor_name(last.name, t) for t in op_tensors(last))
        self.space = SearchSpace(dims, layouts, classifier=classifier)

    def _axis(self, dim: str) -> Axis | None:
        return None if dim in (IMAGE, CLASSES) else Axis(self._index[dim])

    def _layout(self, op: Op, tensor: str) -> TensorLayout:
        g = self.graph
        c = g.size(op.dim)
        if tensor != "weight" or op.kind == "norm":
            return TensorLayout((c,), (self._axis(op.dim),))
        if op.kind == "dwconv":
            return TensorLayout((c, 1, op.kernel, op.kernel), (self._axis(op.dim), None, None, None))
        cin = g.size(op.in_dim)
        if op.kind == "linear":
            inputs = self._axis(op.in_dim)
            grouped = inputs if inputs is None or op.group == 1 else Axis(inputs.dim, group=op.group)
            return TensorLayout((c, cin * op.group), (self._axis(op.dim), grouped))
        shape = (c, cin, op.kernel, op.kernel)
        return TensorLayout(shape, (self._axis(op.dim), self._axis(op.in_dim), None, None))

    def sized(self, units: Sequence[int]) -> Graph:
        """The architecture with ``units[d]`` channels in free dimension ``d``."""
        return self.graph.with_sizes({d: int(u) for d, u in zip(self.graph.free_dims, units, strict=True)})

    def build(self, units: Sequence[int], track_stats: bool | None = None) -> nn.Module:
        """``track_stats``: whether batch norms keep running statistics; by default the whole model does (the global
        model FedTrans and FedAvg evaluate with its running statistics) and a sub-model does not (HeteroFL's static
        BN: clients use batch statistics only; the server's evaluation copy tracks them)."""
        rates = {d: int(u) / self.graph.size(d) for d, u in zip(self.graph.free_dims, units, strict=True)}
        track = tuple(int(u) for u in units) == self.full_units if track_stats is None else track_stats
        return CellNet(self.sized(units), rates if self.cfg.scaler else None, track)

    def cost_units(self) -> list[CostUnit]:
        """One piece per op (adds and flattens save nothing and count no FLOPs). A cell's widths are its input and
        output dimensions (the same dimension twice for a square inserted cell: its FLOPs grow with the square of the
        width), any other op's is its own dimension; fixed dimensions (image channels, classes) are part of the key.
        A piece reads a batch at the op's input resolution."""
        g = self.graph
        res = g.resolutions()
        units: list[CostUnit] = []
        for op in g.ops:
            if op.kind in ("add", "flatten"):
                continue
            ends = (op.in_dim, op.dim) if op.kind in ("conv", "linear") else (op.dim,)
            free = tuple(d for d in ends if d not in (IMAGE, CLASSES))
            fixed = tuple(g.size(d) if d in (IMAGE, CLASSES) else None for d in ends)
            r, first = res[op.inputs[0]], op.inputs[0] == INPUT
            key = (
                "cellnet", op.kind, op.kernel, op.stride, op.bias, op.act, op.norm_kind, op.p, r, fixed, first, op.group
            )  # fmt: skip
            units.append(CostUnit(key, tuple(self._index[d] for d in free), None, _piece(op, fixed, r, first)))
        return units


def _piece(
    op: Op, fixed: tuple[int | None, ...], res: int, first: bool
) -> Callable[[tuple[int, ...]], tuple[nn.Module, _MakeInput]]:
    """The cost piece of one op: the op alone at the given widths of its free ends (``fixed`` holds the other ends)."""

    def make(widths: tuple[int, ...]) -> tuple[nn.Module, _MakeInput]:
        free = iter(widths)
        sizes = [f if f is not None else next(free) for f in fixed]
        c_in, c_out = sizes[0], sizes[-1]
        module: nn.Module
        if op.kind == "conv":
            module = nn.Conv2d(c_in, c_out, op.kernel, op.stride, op.kernel // 2, bias=op.bias)
        elif op.kind == "linear":
            module = nn.Linear(c_in * op.group, c_out, bias=op.bias)
        elif op.kind == "norm":
            # measured as a one-group GroupNorm: a batch norm refuses the cost model's one-sample pass at 1 x 1
            # resolution (MobileNet's last stage); both save their input and a few bytes of statistics
            module = nn.GroupNorm(1, c_out)
        elif op.kind == "mul":
            module = _Product()
        else:
            layer = _layer(op, Graph(ops=(op,), sizes=((op.dim, c_out),), image_size=0), True)
            assert layer is not None
            module = layer

        def make_input(batch: int, device: torch.device) -> torch.Tensor:
            shape = (batch, c_in, res, res) if res > 0 else (batch, c_in * op.group)
            return torch.randn(shape, device=device, requires_grad=not first)

        return module, make_input

    return make


class _Product(nn.Module):
    """A squeeze-and-excitation product alone (cost piece): the features times a per-channel gate, both saved."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.mean(dim=(2, 3), keepdim=True)
