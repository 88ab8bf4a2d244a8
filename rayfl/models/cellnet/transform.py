"""Function-preserving widening and deepening of cells (FedTrans, paper 002 Sec. 4.1; Net2Net, Chen et al. 2015).

A transformation is a step of a model's log (``CellNetConfig.transforms``), applied to the graph here (``apply_step``)
and to the weights (``transform_params``), so that the child computes what its parent computed:

* ``widen CELL K``: the cell's output dimension gets ``K`` times its channels. New channel ``j`` copies old channel
  ``j mod C`` (the old channels stay first, so a parent's tensors are the leading slice of the child's, which soft
  aggregation's HeteroFL-style cropping relies on). Every tensor on the dimension follows: producers' output rows
  and biases, batch-norm vectors and statistics, depthwise filters and squeeze-and-excitation gates are duplicated;
  consumers' input columns are duplicated and divided by ``K``, the number of copies of each channel, so their sums
  are unchanged. Group norms get ``K`` times the groups (each group of copies has the original group's statistics).
  The copies of the producers' filters get Gaussian noise of ``noise`` times the tensor's standard deviation (the
  author code's 5 %), which breaks the copies' symmetry; with ``noise = 0`` the child is exactly the parent.
* ``deepen CELL``: an identity-initialised cell of the same kind and width is inserted after it (a Dirac kernel or an
  identity matrix, zero bias). When the cell's output goes through a ReLU (after its norm, if any) and nothing else
  reads it, the new cell goes after that ReLU and gets a ReLU of its own: ReLU(I ReLU(z)) = ReLU(z), so the inserted
  layer adds a non-linearity and is still exact. Otherwise (a residual branch's last conv, a hard-swish or the
  classifier) it goes right after the cell, before anything else reads its output: a linear map composed with the
  identity. The inserted cell writes a dimension of its own (named after it, as wide as its input; paper 002 Fig. 5:
  a new cell is widened and deepened on its own): it reads the deepened cell's dimension, and everything downstream
  of it that was on that dimension moves to the new one (the next cells' input columns, norms, a depthwise conv and
  its squeeze-and-excitation gate), so widening the inserted cell leaves the deepened cell's width alone and the
  reverse. Where that cannot be (a value from before the insertion is added to or multiplies one after it: a
  residual branch's last conv, whose width is the stream's; an inserted depthwise conv, whose width is its input's;
  a layer inserted after the classifier, which writes the classes), and with ``deepen_width: shared`` (rayfl before
  issue 24), the inserted cell shares the deepened cell's dimension and widening either widens both.
* ``reset``: the model was re-initialised instead of inheriting (the paper's "no warm-up" ablation): it changes no
  architecture, only the similarity (every cell loses its parent's weights, ``mc = -1``).

Tensor names are ``layers.<op>.<tensor>`` (``module.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import lru_cache

import torch

from rayfl.config.model import CellNetConfig
from rayfl.models.cellnet.graph import CLASSES, IMAGE, INPUT, Graph, Op, base_graph

__all__ = [
    "RESET",
    "apply_step",
    "build_graph",
    "deepen_step",
    "insertion_point",
    "op_tensors",
    "parse_step",
    "tensor_name",
    "transform_params",
    "widen_step",
]

RESET = "reset"
_IDEMPOTENT = ("relu", "relu6")  # act(act(z)) = act(z): a layer inserted after them can repeat them exactly


def tensor_name(op: str, tensor: str) -> str:
    return f"layers.{op}.{tensor}"


def op_tensors(op: Op) -> tuple[str, ...]:
    """The floating tensors an op owns (short names: ``weight``, ``bias``, running statistics)."""
    if op.is_cell:
        return ("weight", "bias") if op.bias else ("weight",)
    if op.kind == "norm":
        return ("weight", "bias", "running_mean", "running_var") if op.norm_kind == "batch" else ("weight", "bias")
    return ()


def widen_step(cell: str, factor: int) -> str:
    return f"widen {cell} {factor}"


def deepen_step(cell: str) -> str:
    return f"deepen {cell}"


def parse_step(step: str) -> tuple[str, str, int]:
    """``(kind, cell, factor)`` of a log entry; ``ValueError`` names what is wrong."""
    parts = step.split()
    if parts == [RESET]:
        return RESET, "", 1
    if len(parts) == 3 and parts[0] == "widen" and parts[2].isdigit() and int(parts[2]) >= 2:
        return "widen", parts[1], int(parts[2])
    if len(parts) == 2 and parts[0] == "deepen":
        return "deepen", parts[1], 1
    raise ValueError(f"transform step {step!r}: expected 'widen CELL FACTOR' (FACTOR >= 2), 'deepen CELL' or 'reset'")


def _cell(graph: Graph, name: str) -> Op:
    try:
        op = graph.op(name)
    except KeyError:
        raise ValueError(f"transform: no cell named {name!r}") from None
    if not op.is_cell:
        raise ValueError(f"transform: {name!r} is a {op.kind}, not a cell (conv, dwconv or linear)")
    return op


def apply_step(graph: Graph, step: str, own_width: bool = True) -> Graph:
    """The architecture after one log entry (``own_width``: an inserted cell gets a dimension of its own where it can,
    the module docstring's ``deepen``)."""
    kind, name, factor = parse_step(step)
    if kind == RESET:
        return graph
    cell = _cell(graph, name)
    if kind == "widen":
        if cell.dim in (IMAGE, CLASSES):
            raise ValueError(f"transform: cell {name!r} writes the fixed dimension {cell.dim!r} and cannot be widened")
        sizes = {cell.dim: graph.size(cell.dim) * factor}
        ops = tuple(
            dataclasses.replace(op, groups=op.groups * factor) if op.kind == "norm" and op.dim == cell.dim else op
            for op in graph.ops
        )
        return dataclasses.replace(graph, ops=ops).with_sizes(sizes)
    return _deepen(graph, cell, own_width)


def insertion_point(graph: Graph, cell: Op) -> tuple[str, Op | None]:
    """Where ``deepen`` inserts after ``cell``: the value it reads, and the ReLU it repeats (None: right after the
    cell, no activation)."""
    readers = graph.consumers(cell.name)
    if len(readers) == 1 and readers[0].kind == "norm":
        readers = graph.consumers(readers[0].name)
    if len(readers) == 1 and readers[0].kind == "act" and readers[0].act in _IDEMPOTENT:
        return readers[0].name, readers[0]
    return cell.name, None


def _new_name(graph: Graph, base: str) -> str:
    taken = {op.name for op in graph.ops}
    n = 1
    while f"{base}_d{n}" in taken:
        n += 1
    return f"{base}_d{n}"


def _deepen(graph: Graph, cell: Op, own_width: bool) -> Graph:
    point, act = insertion_point(graph, cell)
    name = _new_name(graph, cell.name)
    kernel = cell.kernel if cell.kind != "linear" else 1
    inserted = [Op(name, cell.kind, (point,), cell.dim, cell.dim, kernel, 1, True)]
    if act is not None:
        inserted.append(Op(f"{name}_a", "act", (name,), cell.dim, act=act.act))
    last = inserted[-1].name
    ops: list[Op] = []
    for op in graph.ops:
        if point in op.inputs:
            op = dataclasses.replace(op, inputs=tuple(last if i == point else i for i in op.inputs))
        ops.append(op)
        if op.name == point:
            ops.extend(inserted)
    shared = dataclasses.replace(graph, ops=tuple(ops))
    if not own_width or cell.kind == "dwconv" or cell.dim in (IMAGE, CLASSES):
        return shared
    return _own_dimension(shared, name) or shared


def _own_dimension(graph: Graph, name: str) -> Graph | None:
    """``graph`` with the inserted cell ``name`` writing a new dimension of its input's size, and every op downstream
    of it on the old dimension moved to the new one; ``None`` when the result is inconsistent (a value on the old
    dimension from before the insertion meets one after it)."""
    old = graph.op(name).dim
    dims = {d for d, _ in graph.sizes}
    new, n = name, 1
    while new in dims:
        new, n = f"{name}_w{n}", n + 1
    downstream = {name}
    ops: list[Op] = []
    for op in graph.ops:
        if op.name == name:
            op = dataclasses.replace(op, dim=new)
        elif any(value in downstream for value in op.inputs):
            downstream.add(op.name)
            op = dataclasses.replace(
                op,
                dim=new if op.dim == old else op.dim,
                in_dim=new if op.is_cell and op.in_dim == old else op.in_dim,
            )
        ops.append(op)
    sizes: list[tuple[str, int]] = []
    for d, s in graph.sizes:
        sizes.append((d, s))
        if d == old:
            sizes.append((new, s))
    out = dataclasses.replace(graph, ops=tuple(ops), sizes=tuple(sizes))
    return out if _consistent(out) else None


def _consistent(graph: Graph) -> bool:
    """Whether every op reads values on the dimensions it expects (a cell its ``in_dim``, a depthwise conv its own,
    any other op its own dimension for every input)."""
    dim_of = {INPUT: IMAGE}
    for op in graph.ops:
        expected = op.in_dim if op.is_cell else op.dim
        if op.kind == "dwconv" and op.in_dim != op.dim:
            return False
        if any(dim_of[v] != expected for v in op.inputs):
            return False
        dim_of[op.name] = op.dim
    return True


# ---------------------------------------------------------------------------------------------------- weights
def _widen_tensor(
    value: torch.Tensor, axes: list[tuple[int, bool]], mapping: torch.Tensor, factor: int, group: int = 1
) -> torch.Tensor:
    """``value`` with each listed axis expanded by ``mapping``; ``True`` marks an input axis (divided by ``factor``),
    whose positions come in runs of ``group`` per channel (a flattened map)."""
    out = value
    for axis, divide in axes:
        index = mapping
        if divide and group > 1:
            index = (mapping[:, None] * group + torch.arange(group)).reshape(-1)
        out = out.index_select(axis, index)
        if divide:
            out = out / factor
    return out


def _widen_params(
    graph: Graph,
    params: Mapping[str, torch.Tensor],
    cell: Op,
    factor: int,
    noise: float,
    generator: torch.Generator | None,
) -> dict[str, torch.Tensor]:
    d, old = cell.dim, graph.size(cell.dim)
    mapping = torch.arange(old * factor) % old
    out = dict(params)
    for op in graph.ops:
        for tensor in op_tensors(op):
            key = tensor_name(op.name, tensor)
            axes: list[tuple[int, bool]] = []
            producer = op.is_cell and op.dim == d
            if producer or (op.kind == "norm" and op.dim == d):
                axes.append((0, False))
            if tensor == "weight" and op.kind in ("conv", "linear") and op.in_dim == d:
                axes.append((1, True))
            if not axes:
                continue
            value = _widen_tensor(params[key], axes, mapping, factor, op.group)
            if producer and tensor == "weight" and noise > 0.0:
                copies = value[old:]
                scale = noise * float(params[key].std()) if params[key].numel() > 1 else 0.0
                copies += scale * torch.randn(copies.shape, generator=generator, dtype=copies.dtype)
            out[key] = value
    return out


def _deepen_params(before: Graph, after: Graph, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``params`` plus identity weights for every cell of ``after`` that ``before`` lacks."""
    known = {op.name for op in before.ops}
    out = dict(params)
    for op in after.ops:
        if op.name in known or not op.is_cell:
            continue
        c, k = after.size(op.dim), op.kernel
        if op.kind == "linear":
            weight = torch.eye(c)
        elif op.kind == "dwconv":
            weight = torch.zeros(c, 1, k, k)
            weight[:, 0, k // 2, k // 2] = 1.0
        else:
            weight = torch.zeros(c, c, k, k)
            weight[torch.arange(c), torch.arange(c), k // 2, k // 2] = 1.0
        out[tensor_name(op.name, "weight")] = weight
        out[tensor_name(op.name, "bias")] = torch.zeros(c)
    return out


def transform_params(
    graph: Graph,
    params: Mapping[str, torch.Tensor],
    step: str,
    noise: float = 0.0,
    generator: torch.Generator | None = None,
    own_width: bool = True,
) -> tuple[Graph, dict[str, torch.Tensor]]:
    """The architecture and weights after one log entry (weights under the model's own tensor names). ``reset`` keeps
    the weights: the caller re-initialises the model. ``own_width``: as ``apply_step``."""
    kind, name, factor = parse_step(step)
    after = apply_step(graph, step, own_width)
    if kind == "widen":
        new = _widen_params(graph, params, graph.op(name), factor, noise, generator)
    elif kind == "deepen":
        new = _deepen_params(graph, after, params)
    else:
        new = dict(params)
    dtypes = {k: v.dtype for k, v in params.items()}
    return after, {k: v.to(dtypes.get(k, v.dtype)).contiguous() for k, v in new.items()}


@lru_cache(maxsize=64)
def build_graph(cfg: CellNetConfig, in_channels: int, num_classes: int, image_size: int) -> Graph:
    """The architecture ``cfg`` describes: its base with the transformation log ``cfg.transforms`` applied in order."""
    graph = base_graph(cfg, in_channels, num_classes, image_size)
    for step in cfg.transforms:
        graph = apply_step(graph, step, cfg.deepen_width == "own")
    return graph
