"""A realised supernet path as a width-elastic family (``model.elastic: width``): a ResNet of the supernet's own ops.

Issue 25's control for FedorAS (paper 003): FjORD runs on a pre-activation ResNet-18 of full 3x3 convolutions, while
FedorAS's models are paths of the supernet's ops (official MBConv with SE, depthwise-separable convs, 1x1 convs).
Running a width method on one path of those ops tells "the family" from "the method": if FjORD on this family trails
FjORD on its ResNet as FedorAS does, the ops explain the gap.

The network is ``SupernetModel`` restricted to ``model.path`` (the same modules, tensor names and initialisation as
``SupernetFamily`` builds for that path), with these dimensions, all kept first-k (ordered dropout) by a spec:

* ``stream{s}``: the channels of stage ``s``'s residual stream (``s`` = 0 is the stem's output; the last is the last
  reduction's output, which the classifier reads). Every tensor that reads or writes a stream shares its dimension,
  so ``x + op(x)`` stays aligned at any width: the stem, each op's input and output convs and norms, a depthwise
  conv's channels, each reduction's input side and the next stream's output side.
* ``layers.{l}.hidden``: the expanded width ``E x c`` of layer ``l``'s ``ds``/``mb`` op: its expansion conv's outputs,
  the norms on them, the separable form's depthwise conv, both 1x1 convs of the Squeeze-and-Excitation (rows and
  columns: the SE is width-elastic with its block) and the projection back's inputs. ``conv1`` and ``identity`` have
  none.

No dimension is skippable: depth is fixed by the path (an ``identity`` layer has no tensors). The tensor layouts are
not written out by hand: each dimension is shrunk by one unit on the meta device and the axes that shrink are the
ones it binds (a test checks one block against a hand-written slice).

Cost pieces: the stem, one per non-identity op (``x + op(x)``; the residual add has no FLOPs and saves nothing), the
reductions, the head, as ``SupernetFamily``'s but priced at their widths. Two products are quadratic in one
dimension, a ``conv1``'s ``c x c`` and the SE's ``h x h``; since the cost model fits costs multilinear in distinct
widths, those pieces are measured with the two ends as separate widths (``make_op``'s ``out`` and ``inner``) and both
ends are mapped to the same dimension, so a sub-model's cost is still the exact sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from rayfl.config.model import SupernetConfig
from rayfl.models.elastic.family import CostUnit, ElasticFamily
from rayfl.models.elastic.space import Axis, Dimension, SearchSpace, TensorLayout
from rayfl.models.supernet import (
    IDENTITY,
    Reduction,
    SupernetFamily,
    SupernetModel,
    _bn,
    _Head,
    _images,
    _stage_channels,
    make_op,
    op_hidden,
    parse_op,
)

__all__ = ["SupernetWidthFamily"]

_Make = Callable[[tuple[int, ...]], tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]]


class SupernetWidthFamily(ElasticFamily):
    """A supernet path (``model.path``) whose stage channels and op widths shrink (module docstring)."""

    def __init__(self, cfg: SupernetConfig, in_channels: int = 3, num_classes: int = 10, *, image_size: int = 32):
        if not cfg.path:
            raise ValueError("model.elastic: width needs model.path (the path whose widths shrink)")
        ops_family = SupernetFamily(cfg, in_channels, num_classes, image_size=image_size)  # checks ops and path
        assert ops_family.path is not None
        self.cfg = cfg
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.image_size = image_size
        self.op_index = ops_family.path
        self.op_names = tuple(cfg.path)
        self.channels = _stage_channels(cfg)
        self.layer_stage = ops_family.layer_stage
        dims = [Dimension(f"stream{s}", c) for s, c in enumerate(self.channels)]
        self.hidden_dim: list[int | None] = []
        for layer, name in enumerate(self.op_names):
            h = op_hidden(name, self.channels[self.layer_stage[layer]])
            if h:
                dims.append(Dimension(f"layers.{layer}.hidden", h))
            self.hidden_dim.append(len(dims) - 1 if h else None)
        sizes = [d.size for d in dims]
        if min(sizes) < 2:
            raise ValueError(f"model.elastic: width needs every stage and op at least 2 channels wide, got {sizes}")
        self.space = SearchSpace(tuple(dims), self._layouts(sizes), classifier=("head.weight", "head.bias"))

    # --- model --------------------------------------------------------------------------------------------------
    def _model(self, units: Sequence[int]) -> SupernetModel:
        streams = [int(units[s]) for s in range(len(self.channels))]
        hidden = [0 if d is None else int(units[d]) for d in self.hidden_dim]
        present = [[op] for op in self.op_index]
        return SupernetModel(self.cfg, self.in_channels, self.num_classes, present, streams, hidden)

    def build(self, units: Sequence[int]) -> nn.Module:
        return self._model(units)

    def _layouts(self, sizes: list[int]) -> dict[str, TensorLayout]:
        """Each tensor's axes: the dimension whose one-unit shrink shrinks that axis (on the meta device)."""
        with torch.device("meta"):
            full = {k: tuple(v.shape) for k, v in self._model(sizes).state_dict().items()}
            axes: dict[str, list[Axis | None]] = {k: [None] * len(shape) for k, shape in full.items()}
            for d in range(len(sizes)):
                smaller = list(sizes)
                smaller[d] -= 1
                for name, tensor in self._model(smaller).state_dict().items():
                    for k, (a, b) in enumerate(zip(full[name], tensor.shape, strict=True)):
                        if a != b:
                            axes[name][k] = Axis(d)
        return {name: TensorLayout(full[name], tuple(axes[name])) for name in full}

    # --- cost pieces --------------------------------------------------------------------------------------------
    def cost_units(self) -> list[CostUnit]:
        c, res, mb = self.channels, self.image_size, self.cfg.mbconv
        resolutions = [res]
        for _ in c[1:]:
            resolutions.append((resolutions[-1] + 1) // 2)
        pieces = [CostUnit(("supernet-w-stem", self.in_channels, res), (0,), None, self._stem_maker(res))]
        for layer, name in enumerate(self.op_names):
            if name == IDENTITY:
                continue
            stage = self.layer_stage[layer]
            kind = parse_op(name)[0]
            hidden = self.hidden_dim[layer]
            dims: tuple[int, ...]
            if kind == "conv":
                dims = (stage, stage)  # c in, c out: one dimension, measured as two
            elif kind == "ds":
                assert hidden is not None
                dims = (stage, hidden)
            else:
                assert hidden is not None
                dims = (stage, hidden, hidden)  # c, h, and the SE's h x h as h, h
            key = ("supernet-w-op", name, resolutions[stage], mb if kind == "mb" else "")
            pieces.append(CostUnit(key, dims, None, _op_maker(name, kind, resolutions[stage], mb)))
        for s in range(len(c) - 1):
            pieces.append(
                CostUnit(("supernet-w-reduction", resolutions[s]), (s, s + 1), None, _red_maker(resolutions[s]))
            )
        last = len(c) - 1
        pieces.append(
            CostUnit(
                ("supernet-w-head", self.num_classes, resolutions[-1]),
                (last,),
                None,
                lambda w: (_Head(w[0], self.num_classes), _images(w[0], resolutions[-1], True)),
            )
        )
        return pieces

    def _stem_maker(self, res: int) -> _Make:
        def make(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
            stem = nn.Sequential(nn.Conv2d(self.in_channels, w[0], 3, padding=1, bias=False), _bn(w[0]), nn.ReLU())
            return stem, _images(self.in_channels, res, False)

        return make


class _Branch(nn.Module):
    """``op(x)`` alone: the cost piece of a block ``x + op(x)`` whose op reads and writes different widths."""

    def __init__(self, op: nn.Module) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.op(x)
        return out


def _op_maker(name: str, kind: str, res: int, mbconv: str) -> _Make:
    def make(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
        if kind == "conv":
            op = make_op(name, w[0], mbconv, out=w[1])
        elif kind == "ds":
            op = make_op(name, w[0], mbconv, hidden=w[1])
        else:
            op = make_op(name, w[0], mbconv, hidden=w[1], inner=w[2])
        return _Branch(op), _images(w[0], res, True)

    return make


def _red_maker(res: int) -> _Make:
    return lambda w: (Reduction(w[0], w[1]), _images(w[0], res, True))
