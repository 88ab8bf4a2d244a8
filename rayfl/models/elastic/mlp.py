"""Elastic multilayer perceptron (``model.name: mlp``) for feature vectors: a table's numeric columns, or images
flattened channel-major.

**Plain** (``residual: false``): per width in ``cfg.hidden`` a layer ``layers.k`` (linear with bias) → ``Scaler`` →
norm ``norms.k``; the activation and dropout come before every later linear and before the classifier ``head``. One
dimension per hidden layer (``hidden1`` .. ``hiddenN``), none skippable: removing a layer would change the width the
next one reads. Index rules: a layer's weight rows, its bias and its norm follow its own dimension, its columns the
previous layer's (every input feature for the first); the classifier keeps all classes and its columns follow the last
layer's.

**Residual** (``residual: true``): ``layers.0`` writes a residual stream of ``hidden[0]`` units (dimension ``stream``,
never skipped; an input embedding, no activation on it) and every later width is a pre-norm block ``blocks.j``,
``x + scaler(fc2(dropout(act(scaler(fc1(norm(x)))))))``, whose inner width (dimension ``block{j+1}``) is skippable:
0 units remove the block with its norm (all its tensors gate on that dimension), so the block is the identity, as a
ResNet's or a transformer's removed blocks are. Every tensor that reads or writes the stream uses the stream's index
set, so residual adds stay aligned under any selector (FedRolex's window, AnyCostFL's norms, random subsets).

Norms: ``batch`` is HeteroFL's static BN (batch statistics, running statistics only in the server's evaluation copy,
``build(track_stats=True)``); a batch of one sample, which torch refuses to normalise with its own statistics, is
normalised as those statistics say (mean = the sample, variance 0). ``layer`` is LayerNorm over the kept units.
The scaler (``cfg.scaler``, HeteroFL's) divides a hidden linear's output by its dimension's width rate in training.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rayfl.config.model import MLPConfig
from rayfl.models.elastic.family import CostUnit, ElasticFamily, Scaler
from rayfl.models.elastic.space import Axis, Dimension, SearchSpace, TensorLayout

__all__ = ["ElasticMLP", "MLPFamily"]

_MakeInput = Callable[[int, torch.device], torch.Tensor]


class _StaticBatchNorm(nn.BatchNorm1d):
    """``BatchNorm1d`` that also normalises a batch of one sample with its own statistics (the output is then the
    bias), where torch refuses one value per channel: a client's last batch may hold one sample."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1 and (self.training or not self.track_running_stats):
            out: torch.Tensor = super().forward(x.expand(2, *x.shape[1:]))
            return out[:1]
        result: torch.Tensor = super().forward(x)
        return result


def _norm(kind: str, width: int, track: bool, single_sample: bool = True) -> nn.Module:
    """``single_sample``: the model's batch norm; the cost pieces use torch's own (see ``cost.fit_unit``)."""
    if kind == "batch":
        cls = _StaticBatchNorm if single_sample else nn.BatchNorm1d
        return cls(width, momentum=None, track_running_stats=track)
    if kind == "layer":
        return nn.LayerNorm(width)
    return nn.Identity()


def _act(name: str) -> nn.Module:
    kinds: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "relu6": nn.ReLU6, "gelu": nn.GELU}
    return kinds[name]()


def _dropout(p: float) -> nn.Module:
    return nn.Dropout(p) if p > 0.0 else nn.Identity()  # a zero-rate dropout would still save a mask


def _scaler(use: bool, rate: float) -> nn.Module:
    return Scaler(rate) if use else nn.Identity()


@dataclass(frozen=True)
class _Shape:
    """What an ``ElasticMLP`` is built from besides its widths."""

    in_features: int
    num_classes: int
    full: tuple[int, ...]  # cfg.hidden
    residual: bool
    act: str
    norm: str
    dropout: float
    scaler: bool


class _Block(nn.Module):
    """A residual block's branch, ``scaler(fc2(dropout(act(scaler(fc1(norm(x)))))))``; the add is the caller's."""

    def __init__(self, shape: _Shape, stream: int, inner: int, rates: tuple[float, float], track: bool) -> None:
        super().__init__()
        self.norm = _norm(shape.norm, stream, track)
        self.fc1 = nn.Linear(stream, inner)
        self.s1 = _scaler(shape.scaler, rates[1])
        self.act = _act(shape.act)
        self.drop = _dropout(shape.dropout)
        self.fc2 = nn.Linear(inner, stream)
        self.s2 = _scaler(shape.scaler, rates[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.s2(self.fc2(self.drop(self.act(self.s1(self.fc1(self.norm(x)))))))
        return out


class _Residual(nn.Module):
    """``x + branch(x)``: one block alone, for the cost model."""

    def __init__(self, branch: nn.Module) -> None:
        super().__init__()
        self.branch = branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.branch(x)
        return out


class ElasticMLP(nn.Module):
    """The MLP at ``units`` per dimension, its tensors named as the global model's (see module docstring); a removed
    block is an ``nn.Identity`` in its place (the block computes nothing), so later blocks keep their names."""

    def __init__(self, shape: _Shape, units: Sequence[int], track: bool = False) -> None:
        super().__init__()
        rates = [u / f for u, f in zip(units, shape.full, strict=True)]
        layers = 1 if shape.residual else len(shape.full)
        self.layers = nn.ModuleList()
        self.scalers = nn.ModuleList()
        self.norms = nn.ModuleList()
        prev = shape.in_features
        for k in range(layers):
            self.layers.append(nn.Linear(prev, units[k]))
            self.scalers.append(_scaler(shape.scaler, rates[k]))
            self.norms.append(_norm(shape.norm, units[k], track))
            prev = units[k]
        inner = range(1, len(shape.full)) if shape.residual else range(0)
        self.blocks = nn.ModuleList(
            _Block(shape, units[0], units[j], (rates[0], rates[j]), track) if units[j] > 0 else nn.Identity()
            for j in inner
        )
        self.act = _act(shape.act)
        self.drop = _dropout(shape.dropout)
        self.head = nn.Linear(prev, shape.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for k, (layer, scaler, norm) in enumerate(zip(self.layers, self.scalers, self.norms, strict=True)):
            if k > 0:
                x = self.drop(self.act(x))
            x = norm(scaler(layer(x)))
        for block in self.blocks:
            if isinstance(block, _Block):
                x = x + block(x)
        logits: torch.Tensor = self.head(self.drop(self.act(x)))
        return logits


class MLPFamily(ElasticFamily):
    """Search space and builder of the elastic MLP (see module docstring). ``sample_shape``: one sample's shape as the
    data gives it (``(F,)`` features, ``(C, H, W)`` images, flattened by the model)."""

    def __init__(self, cfg: MLPConfig, sample_shape: Sequence[int], num_classes: int) -> None:
        if not cfg.hidden or min(cfg.hidden) < 1:
            raise ValueError(f"model.hidden needs at least one positive width, got {list(cfg.hidden)}")
        self.cfg = cfg
        self.sample_shape = tuple(int(d) for d in sample_shape)
        self.num_classes = num_classes
        self.shape = _Shape(
            in_features=math.prod(self.sample_shape),
            num_classes=num_classes,
            full=tuple(cfg.hidden),
            residual=cfg.residual,
            act=cfg.act,
            norm=cfg.norm,
            dropout=cfg.dropout,
            scaler=cfg.scaler,
        )
        self.space = self._space()

    def _space(self) -> SearchSpace:
        cfg, shape = self.cfg, self.shape
        if cfg.residual:
            dims = [Dimension("stream", cfg.hidden[0])]
            dims += [Dimension(f"block{j}", w, skippable=True) for j, w in enumerate(cfg.hidden[1:], start=1)]
        else:
            dims = [Dimension(f"hidden{k + 1}", w) for k, w in enumerate(cfg.hidden)]
        layouts: dict[str, TensorLayout] = {}
        prev, prev_axis = shape.in_features, None
        for k in range(1 if cfg.residual else len(cfg.hidden)):
            width, out = cfg.hidden[k], Axis(k)
            layouts[f"layers.{k}.weight"] = TensorLayout((width, prev), (out, prev_axis))
            layouts[f"layers.{k}.bias"] = TensorLayout((width,), (out,))
            if cfg.norm != "none":
                layouts[f"norms.{k}.weight"] = TensorLayout((width,), (out,))
                layouts[f"norms.{k}.bias"] = TensorLayout((width,), (out,))
            prev, prev_axis = width, out
        stream = Axis(0)
        for j, inner in enumerate(cfg.hidden[1:] if cfg.residual else ()):
            d, p = j + 1, f"blocks.{j}."
            if cfg.norm != "none":
                layouts[p + "norm.weight"] = TensorLayout((prev,), (stream,), d)
                layouts[p + "norm.bias"] = TensorLayout((prev,), (stream,), d)
            layouts[p + "fc1.weight"] = TensorLayout((inner, prev), (Axis(d), stream), d)
            layouts[p + "fc1.bias"] = TensorLayout((inner,), (Axis(d),), d)
            layouts[p + "fc2.weight"] = TensorLayout((prev, inner), (stream, Axis(d)), d)
            layouts[p + "fc2.bias"] = TensorLayout((prev,), (stream,), d)
        layouts["head.weight"] = TensorLayout((self.num_classes, prev), (None, prev_axis))
        layouts["head.bias"] = TensorLayout((self.num_classes,), (None,))
        return SearchSpace(tuple(dims), layouts, classifier=("head.weight", "head.bias"))

    def build(self, units: Sequence[int], track_stats: bool = False) -> nn.Module:
        """``track_stats``: batch norms keep running statistics (the server's static-BN evaluation copy)."""
        return ElasticMLP(self.shape, list(units), track_stats)

    def stage_blocks(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """One stage of the removable blocks (residual only): "the first n blocks" names a shallower MLP."""
        if not self.cfg.residual:
            return ()
        return (tuple((d,) for d in range(1, len(self.cfg.hidden))),)

    def cost_units(self) -> list[CostUnit]:
        """The first layer (flatten → linear → scaler → norm), then per later layer act → dropout → linear → scaler →
        norm (plain) or per block the whole residual block (residual), then act → dropout → classifier: an activation
        sits in the piece of the linear that reads it, so the tensor it saves is never counted twice."""
        shape, cfg = self.shape, self.cfg
        style = (cfg.act, cfg.dropout, cfg.norm, cfg.scaler)
        sample = self.sample_shape

        def first(w: tuple[int, ...]) -> tuple[nn.Module, _MakeInput]:
            layers = [nn.Flatten(), nn.Linear(shape.in_features, w[0]), _scaler(cfg.scaler, 0.5)]
            return nn.Sequential(*layers, _norm(cfg.norm, w[0], False, False)), _rows(sample, False)

        def layer(w: tuple[int, ...]) -> tuple[nn.Module, _MakeInput]:
            layers = [_act(cfg.act), _dropout(cfg.dropout), nn.Linear(w[0], w[1]), _scaler(cfg.scaler, 0.5)]
            return nn.Sequential(*layers, _norm(cfg.norm, w[1], False, False)), _rows((w[0],), True)

        def block(w: tuple[int, ...]) -> tuple[nn.Module, _MakeInput]:
            branch = _Block(shape, w[0], w[1], (0.5, 0.5), False)
            branch.norm = _norm(cfg.norm, w[0], False, False)
            return _Residual(branch), _rows((w[0],), True)

        def head(w: tuple[int, ...]) -> tuple[nn.Module, _MakeInput]:
            layers = [_act(cfg.act), _dropout(cfg.dropout), nn.Linear(w[0], shape.num_classes)]
            return nn.Sequential(*layers), _rows((w[0],), True)

        units = [CostUnit(("mlp_first", sample, cfg.norm, cfg.scaler), (0,), None, first)]
        if cfg.residual:
            for d in range(1, len(cfg.hidden)):
                units.append(CostUnit(("mlp_block", style), (0, d), d, block))
            last = 0
        else:
            for d in range(1, len(cfg.hidden)):
                units.append(CostUnit(("mlp_layer", style), (d - 1, d), None, layer))
            last = len(cfg.hidden) - 1
        units.append(CostUnit(("mlp_head", cfg.act, cfg.dropout, shape.num_classes), (last,), None, head))
        return units


def _rows(sample: tuple[int, ...], grad: bool) -> _MakeInput:
    def make(batch: int, device: torch.device) -> torch.Tensor:
        return torch.randn(batch, *sample, device=device, requires_grad=grad)

    return make
