"""FedorAS's supernet as an elastic family: every (searchable layer, candidate op) is a one-unit, skippable dimension.

Paper 003 (Dudziak et al., "FedorAS", Sec. 3.1, App. D.3) and the official ``src/models/resnet_model.py``
(ALGORITHMS.md section 10): a 3x3 stem, then stages of searchable blocks, each a choice among candidate operations,
each stage followed by a strided reduction (depthwise 3x3 stride 2 + pointwise, plus a 1x1 strided projection
shortcut; channels x ``width_mult``; after the last stage too, as the paper's "each followed by a fixed reduction
block" and the official model), global pooling and a linear classifier. Candidates (``SupernetConfig.ops``):

* ``conv1``: standard 1x1 conv → BN → ReLU;
* ``ds3_eE``: depthwise-separable 3x3: depthwise 3x3 → BN → ReLU → pointwise to ``E x c`` → BN → ReLU → pointwise back
  to ``c`` → BN;
* ``mbK_eE``: MBConv, as the official code (``model.mbconv: official``, the default): a full KxK conv from ``c`` to
  ``E x c`` → BN → ReLU → Squeeze-and-Excitation → pointwise back to ``c`` → BN; or (``model.mbconv: separable``,
  rayfl's earlier CPU-cheap form) pointwise to ``E x c`` → BN → ReLU → depthwise KxK → BN → ReLU → SE → pointwise
  back to ``c`` → BN. The SE is the official ``SE``: global average pool, 1x1 conv → ReLU → 1x1 conv (with
  biases, ``E x c`` channels throughout: no reduction ratio), sigmoid gate on the expanded features; it is part of
  the op, so the cost model prices it with the op (its FLOPs are small: two ``(E c)^2`` products per sample on the
  pooled features; its parameters are not);
* ``identity``: nothing, so the block is skipped and depth is searchable.

Differences from the official ops: the official DSConv is a grouped KxK conv to ``E x c`` then a pointwise back
(ours adds a depthwise stage before); the official reduction's shortcut is a 2x2 stride-2 conv and its sum has no
ReLU after it. The separable MBConv (``mbconv: separable``) is kept as a named option only: with it no searchable op
mixes channels over a 3x3 neighbourhood (issue 25).

A block computes ``x + op(x)`` (identity: ``x``), so a skipped block is exactly the identity. Batch norms use batch
statistics (``track_running_stats=False``, as every rayfl family), so there are no running statistics to aggregate.

A *realised path* (``model.path``: one op name per block, FedorAS's per-tier models) is the same family restricted
to that path's ops: a stand-alone network whose tensors have the supernet's names, so the supernet's weights copy over
by name and the cost model prices it with the very pieces that priced the path inside the supernet.

Why dimensions of size one: a *subspace* (the ops a client may use this round, paper Eq. 2) and a *path* (one op per
layer) are then ordinary unit vectors of the family. ``build(units)`` builds a model holding exactly the ops whose
unit is 1, with the global tensor names, so the engine's hosts build, load and scatter a client's subspace like any
sub-model, and bytes moved are the subspace's. The cost model sums one cost piece per present op: for a path that is
exactly the path's parameters and FLOPs (each op measured on the meta device at its input shape, as the official
``compute_cost_mat`` does with ptflops); for a subspace with several ops per layer it is an upper bound (a client runs
one path per batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from rayfl.config.model import SupernetConfig
from rayfl.models.elastic.family import CostUnit, ElasticFamily
from rayfl.models.elastic.space import Dimension, SearchSpace, TensorLayout

__all__ = ["SupernetFamily", "SupernetModel", "parse_op"]

_MakeInput = Callable[[int, torch.device], torch.Tensor]
IDENTITY = "identity"


def parse_op(name: str) -> tuple[str, int, float]:
    """``(kind, kernel, expansion)`` of a candidate op name (``conv1``, ``ds3_e0.5``, ``mb3_e2``, ``identity``)."""
    if name == IDENTITY:
        return IDENTITY, 0, 0.0
    if name == "conv1":
        return "conv", 1, 1.0
    for kind in ("ds", "mb"):
        if name.startswith(kind) and "_e" in name:
            kernel, expansion = name[len(kind) :].split("_e")
            return kind, int(kernel), float(expansion)
    raise ValueError(f"unknown supernet op {name!r}")


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, track_running_stats=False)


class SqueezeExcite(nn.Module):
    """Squeeze-and-Excitation on ``channels`` (the official ``SE``: pooled features through 1x1 conv → ReLU → 1x1
    conv, both with biases and no channel reduction, then a sigmoid gate per channel). ``inner`` (default
    ``channels``) differs only in the cost model's pieces, which measure the ``channels x channels`` products with
    two separate widths (the fit is multilinear in distinct widths)."""

    def __init__(self, channels: int, inner: int | None = None) -> None:
        super().__init__()
        inner = channels if inner is None else inner
        self.squeeze = nn.Conv2d(channels, inner, 1)
        self.excite = nn.Conv2d(inner, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.excite(torch.relu(self.squeeze(x.mean(dim=(2, 3), keepdim=True)))))
        return x * gate


def op_hidden(name: str, channels: int) -> int:
    """The expanded width ``E x c`` of a ``ds``/``mb`` op on ``channels`` channels (0 for ``conv1``/``identity``)."""
    kind, _, expansion = parse_op(name)
    return max(1, round(expansion * channels)) if kind in ("ds", "mb") else 0


def make_op(
    name: str,
    channels: int,
    mbconv: str = "official",
    *,
    hidden: int | None = None,
    out: int | None = None,
    inner: int | None = None,
) -> nn.Module:
    """One candidate op on ``channels`` channels (stride 1, same channels in and out); ``mbconv`` picks the MBConv's
    form (``official``: full KxK expansion conv; ``separable``: pointwise expansion then depthwise KxK).

    ``hidden``: the expanded width (default ``E x channels``; a width-elastic path's sub-model keeps fewer).
    ``out`` (default ``channels``) and ``inner`` (the SE's inner width, default ``hidden``) only for the cost
    model's pieces of the width-elastic family: they give the two ends of a ``c x c`` or ``h x h`` product separate
    widths so that the measured costs are multilinear in distinct widths."""
    kind, kernel, _ = parse_op(name)
    hidden = op_hidden(name, channels) if hidden is None else hidden
    out = channels if out is None else out
    if kind == "conv":
        return nn.Sequential(nn.Conv2d(channels, out, 1, bias=False), _bn(out), nn.ReLU())
    if kind == "ds":
        return nn.Sequential(
            nn.Conv2d(channels, channels, kernel, padding=kernel // 2, groups=channels, bias=False),
            _bn(channels),
            nn.ReLU(),
            nn.Conv2d(channels, hidden, 1, bias=False),
            _bn(hidden),
            nn.ReLU(),
            nn.Conv2d(hidden, out, 1, bias=False),
            _bn(out),
        )
    if kind == "mb" and mbconv == "official":
        return nn.Sequential(
            nn.Conv2d(channels, hidden, kernel, padding=kernel // 2, bias=False),
            _bn(hidden),
            nn.ReLU(),
            SqueezeExcite(hidden, inner),
            nn.Conv2d(hidden, out, 1, bias=False),
            _bn(out),
        )
    if kind == "mb" and mbconv == "separable":
        return nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False),
            _bn(hidden),
            nn.ReLU(),
            nn.Conv2d(hidden, hidden, kernel, padding=kernel // 2, groups=hidden, bias=False),
            _bn(hidden),
            nn.ReLU(),
            SqueezeExcite(hidden, inner),
            nn.Conv2d(hidden, out, 1, bias=False),
            _bn(out),
        )
    if kind == "mb":
        raise ValueError(f"model.mbconv: {mbconv!r} is neither 'official' nor 'separable'")
    raise ValueError(f"op {name!r} has no module (identity is handled by the block)")


class Reduction(nn.Module):
    """Depthwise 3x3 stride 2 → BN → ReLU → pointwise → BN, plus a strided 1x1 projection shortcut; then ReLU."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(c_in, c_in, 3, stride=2, padding=1, groups=c_in, bias=False),
            _bn(c_in),
            nn.ReLU(),
            nn.Conv2d(c_in, c_out, 1, bias=False),
            _bn(c_out),
        )
        self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=2, bias=False), _bn(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.main(x) + self.shortcut(x))


class _Block(nn.Module):
    """``x + op(x)`` for one op (a cost piece)."""

    def __init__(self, op: nn.Module) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.op(x)
        return out


class _Head(nn.Module):
    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(x.mean(dim=(2, 3)))
        return out


class SupernetModel(nn.Module):
    """The supernet restricted to the ops of ``present`` (per layer, op indices into ``ops``).

    ``path`` (one op index per layer, each present) chooses the ops the next forward passes run; with ``path`` unset
    every layer must hold exactly one op (a realised path, or the evaluation of one).

    ``channels`` (each stage's, then the classifier's) and ``hidden`` (each layer's expanded width, 0 where its op
    has none) default to the config's; a sub-model of the width-elastic family passes fewer.
    """

    def __init__(
        self,
        cfg: SupernetConfig,
        in_channels: int,
        num_classes: int,
        present: Sequence[Sequence[int]],
        channels: Sequence[int] | None = None,
        hidden: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.op_names = tuple(cfg.ops)
        self.present = tuple(tuple(int(o) for o in layer) for layer in present)
        channels = list(_stage_channels(cfg) if channels is None else channels)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, channels[0], 3, padding=1, bias=False), _bn(channels[0]))
        layers: list[nn.ModuleDict] = []
        self.stage_of_layer: list[int] = []
        for s, blocks in enumerate(cfg.blocks_per_stage):
            for _ in range(blocks):
                width = None if hidden is None else hidden[len(layers)]
                ops = {
                    str(o): make_op(self.op_names[o], channels[s], cfg.mbconv, hidden=width)
                    for o in self.present[len(layers)]
                    if self.op_names[o] != IDENTITY
                }
                layers.append(nn.ModuleDict(ops))
                self.stage_of_layer.append(s)
        self.layers = nn.ModuleList(layers)
        self.reductions = nn.ModuleList(Reduction(channels[s], channels[s + 1]) for s in range(len(channels) - 1))
        self.head = nn.Linear(channels[-1], num_classes)
        self.path: tuple[int, ...] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        path = self.path
        x = torch.relu(self.stem(x))
        stage = 0
        for layer_idx, layer in enumerate(self.layers):
            if self.stage_of_layer[layer_idx] != stage:
                x = self.reductions[stage](x)
                stage = self.stage_of_layer[layer_idx]
            if path is not None:
                op = path[layer_idx]
            elif len(self.present[layer_idx]) == 1:
                op = self.present[layer_idx][0]
            else:
                raise ValueError(f"supernet layer {layer_idx} holds {len(self.present[layer_idx])} ops and no path")
            if op not in self.present[layer_idx]:
                raise ValueError(f"supernet layer {layer_idx}: op {op} is not in this model")
            if self.op_names[op] != IDENTITY:
                x = x + layer[str(op)](x)  # type: ignore[index]  # a ModuleDict (ModuleList erases the type)
        while stage < len(self.reductions):  # the last stage's reduction
            x = self.reductions[stage](x)
            stage += 1
        logits: torch.Tensor = self.head(x.mean(dim=(2, 3)))
        return logits


def _stage_channels(cfg: SupernetConfig) -> list[int]:
    """Channels of every stage, then after the last stage's reduction (what the classifier reads)."""
    channels = [cfg.stem_channels]
    for _ in cfg.blocks_per_stage:
        channels.append(max(1, round(channels[-1] * cfg.width_mult)))
    return channels


class SupernetFamily(ElasticFamily):
    """Search space (one unit per layer and op), builder and cost pieces of the supernet (module docstring)."""

    def __init__(self, cfg: SupernetConfig, in_channels: int = 3, num_classes: int = 10, *, image_size: int = 32):
        if not cfg.ops:
            raise ValueError("model.ops needs at least one candidate op")
        for op in cfg.ops:
            parse_op(op)
        self.cfg = cfg
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.image_size = image_size
        self.op_names = tuple(cfg.ops)
        self.num_ops = len(cfg.ops)
        self.channels = _stage_channels(cfg)
        self.layer_stage = [s for s, blocks in enumerate(cfg.blocks_per_stage) for _ in range(blocks)]
        self.num_layers = len(self.layer_stage)
        self.identity = self.op_names.index(IDENTITY) if IDENTITY in self.op_names else None
        self.path = self._realised_path(cfg.path)
        # the (layer, op) pairs the model has: all of them, or a realised path's one op per layer
        self.layer_ops = tuple(
            (layer, op)
            for layer in range(self.num_layers)
            for op in (range(self.num_ops) if self.path is None else (self.path[layer],))
        )
        self._dim = {pair: d for d, pair in enumerate(self.layer_ops)}
        self._index = tuple(np.array(self.layer_ops, dtype=np.int64).T)  # (layers, ops) of the dimensions
        self._available = np.zeros((self.num_layers, self.num_ops), dtype=bool)
        self._available[self._index] = True
        dims = tuple(Dimension(f"layers.{layer}.{op}", 1, skippable=True) for layer, op in self.layer_ops)
        with torch.device("meta"):
            full = self._model([np.flatnonzero(row).tolist() for row in self._available])
        layouts: dict[str, TensorLayout] = {}
        for name, tensor in full.state_dict().items():
            parts = name.split(".")
            gate = self.dim_of(int(parts[1]), int(parts[2])) if parts[0] == "layers" else None
            layouts[name] = TensorLayout(tuple(tensor.shape), (None,) * tensor.dim(), gate)
        self.space = SearchSpace(dims, layouts, classifier=("head.weight", "head.bias"))

    def _realised_path(self, names: Sequence[str]) -> tuple[int, ...] | None:
        """Op indices of ``model.path`` (None for the whole supernet)."""
        if not names:
            return None
        if len(names) != self.num_layers:
            raise ValueError(f"model.path names {len(names)} ops; the supernet has {self.num_layers} searchable blocks")
        unknown = [n for n in names if n not in self.op_names]
        if unknown:
            raise ValueError(f"model.path: {unknown} are not among model.ops {list(self.op_names)}")
        return tuple(self.op_names.index(n) for n in names)

    # --- units <-> ops -----------------------------------------------------------------------------------------
    def dim_of(self, layer: int, op: int) -> int:
        """The dimension of op ``op`` in layer ``layer`` (``layer x num_ops + op`` for the whole supernet)."""
        return self._dim[(layer, op)]

    def layer_op(self, dim: int) -> tuple[int, int]:
        """``(layer, op)`` of a dimension (the inverse of ``dim_of``)."""
        return self.layer_ops[dim]

    def units_of_mask(self, mask: np.ndarray) -> tuple[int, ...]:
        """Units of a subspace: ``mask[l, o]`` says layer ``l`` holds op ``o`` (only ops the model has)."""
        m = np.asarray(mask, dtype=bool)
        if m.shape != (self.num_layers, self.num_ops):
            raise ValueError(f"a subspace mask has shape {(self.num_layers, self.num_ops)}, got {m.shape}")
        if (m & ~self._available).any():
            raise ValueError("the mask holds ops this model (a realised path) does not have")
        return tuple(int(v) for v in m[self._index])

    def units_of_path(self, path: Sequence[int] | np.ndarray) -> tuple[int, ...]:
        mask = np.zeros((self.num_layers, self.num_ops), dtype=bool)
        mask[np.arange(self.num_layers), np.asarray(path, dtype=np.int64)] = True
        return self.units_of_mask(mask)

    def mask_of_units(self, units: Sequence[int]) -> np.ndarray:
        mask = np.zeros((self.num_layers, self.num_ops), dtype=bool)
        mask[self._index] = np.asarray(units, dtype=bool)
        return mask

    def path_names(self, path: Sequence[int] | np.ndarray) -> tuple[str, ...]:
        """The op names of a path (a realised path's ``model.path``)."""
        return tuple(self.op_names[int(o)] for o in path)

    # --- ElasticFamily -----------------------------------------------------------------------------------------
    def _model(self, present: Sequence[Sequence[int]]) -> SupernetModel:
        return SupernetModel(self.cfg, self.in_channels, self.num_classes, present)

    def build(self, units: Sequence[int]) -> nn.Module:
        mask = self.mask_of_units(units)
        return self._model([np.flatnonzero(row).tolist() for row in mask])

    def cost_units(self) -> list[CostUnit]:
        """Stem, one piece per (layer, non-identity op) gated on its dimension, the reductions, the head."""
        c, res = self.channels, self.image_size
        pieces = [
            CostUnit(
                ("supernet-stem", self.in_channels, c[0], res),
                (),
                None,
                lambda _w: (nn.Sequential(self._stem(), nn.ReLU()), _images(self.in_channels, res, False)),
            )
        ]
        sizes = [res]
        for _ in c[1:]:
            sizes.append((sizes[-1] + 1) // 2)
        for layer, op in self.layer_ops:
            name, stage = self.op_names[op], self.layer_stage[layer]
            if name == IDENTITY:
                continue
            pieces.append(
                CostUnit(
                    # "se": the MBConv's measured pieces changed with its SE, and its form (the fit cache is keyed
                    # by this; the separable form keeps its earlier key)
                    ("supernet-op", name, c[stage], sizes[stage], *self._mb_key(name)),
                    (),
                    self.dim_of(layer, op),
                    _op_maker(name, c[stage], sizes[stage], self.cfg.mbconv),
                )
            )
        for s in range(len(c) - 1):
            pieces.append(CostUnit(("supernet-reduction", c[s], c[s + 1], sizes[s]), (), None, _red_maker(c, s, sizes)))
        pieces.append(
            CostUnit(
                ("supernet-head", c[-1], self.num_classes, sizes[-1]),
                (),
                None,
                lambda _w: (_Head(c[-1], self.num_classes), _images(c[-1], sizes[-1], True)),
            )
        )
        return pieces

    def _mb_key(self, name: str) -> tuple[str, ...]:
        if not name.startswith("mb"):
            return ()
        return ("se",) if self.cfg.mbconv == "separable" else ("se", self.cfg.mbconv)

    def _stem(self) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(self.in_channels, self.channels[0], 3, padding=1, bias=False), _bn(self.channels[0])
        )


def _images(channels: int, res: int, grad: bool) -> _MakeInput:
    def make(batch: int, device: torch.device) -> torch.Tensor:
        return torch.randn(batch, channels, res, res, device=device, requires_grad=grad)

    return make


def _op_maker(
    name: str, channels: int, res: int, mbconv: str
) -> Callable[[tuple[int, ...]], tuple[nn.Module, _MakeInput]]:
    return lambda _w: (_Block(make_op(name, channels, mbconv)), _images(channels, res, True))


def _red_maker(
    channels: Sequence[int], stage: int, sizes: Sequence[int]
) -> Callable[[tuple[int, ...]], tuple[nn.Module, _MakeInput]]:
    return lambda _w: (Reduction(channels[stage], channels[stage + 1]), _images(channels[stage], sizes[stage], True))
