"""FedTrans's equations as pure functions (paper 002, Zhu et al., MLSys 2024): degree of convergence (Eq. 1), model
sampling (Eq. 2-3), joint utility learning (Eq. 4), cell-wise model similarity (Sec. 4.2), soft aggregation (Eq. 5)
and cell selection by activeness (Sec. 4.1). ``fedtrans.py`` wires them into the engine's hooks.

Choices where the paper leaves room (each also noted where it is made):

* **DoC** is the mean of the last ``gamma`` signed slopes ``(L(i - step) - L(i)) / step`` of the newest model's
  per-round training loss, as Eq. 1 writes it (the author code averages absolute differences); NaN until
  ``gamma + step`` losses exist.
* **Similarity** between any two models of a family is the mean over the later (larger) model's cells of the
  paper's matching degree ``mc``: 1 for a cell inherited with its shape, ``#param(small) / #param(large)`` for one
  whose tensors grew (a widened cell, or a consumer of a widened dimension: the portion of inherited weights), 0 for
  a cell inserted since, -1 for every cell of a model re-initialised since (the "no warm-up" ablation); clipped to
  [0, 1], so ``sim(M, M) = 1``. The paper "cumulates" the cells' scores but needs ``sim`` in [0, 1]; the mean does
  both (the author code sums and then divides each row by its largest entry).
* **Soft aggregation** divides by the sum of the coefficients actually used, ``eta^t sim`` included (Eq. 5 prints
  ``sum sim`` below a numerator that carries the decay, which would shrink a model's weights every round the decay
  removes a neighbour; the author code normalises by the weights it used).
* **Cropping across a widening** (``input_scales``). Widening a dimension by ``K`` divides its consumers' input
  columns by ``K`` (function preservation), so a consumer's leading slice in the child holds the parent's columns
  divided by ``K``. Adding the parent's full-scale columns into that slice, as the paper's HeteroFL-style crop does
  literally, pulls the child's columns towards ``K`` times their scale: averaging a parent with its own noise-free
  child does not give back the function both compute. With ``FedTransConfig.rescale_cropped`` (the default) a
  source's input columns of a dimension the two models size differently are multiplied by ``size in source / size
  in receiver`` before they enter the receiver's leading slice, which puts them on the receiver's scale (the cropping
  is about shapes in the paper; this keeps the function); ``rescale_cropped: false`` is the literal crop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from rayfl.core.messages import Params
from rayfl.models.cellnet.graph import Graph, Op
from rayfl.models.cellnet.transform import RESET, tensor_name

__all__ = [
    "cell_params",
    "degree_of_convergence",
    "input_scales",
    "model_similarity",
    "sample_model",
    "select_cells",
    "soft_aggregate",
    "softmax",
    "update_utilities",
]


def degree_of_convergence(losses: Sequence[float], gamma: int, step: int) -> float:
    """Eq. 1: the mean of the last ``gamma`` slopes ``(L(i - step) - L(i)) / step`` (NaN with too few losses)."""
    n = len(losses)
    if gamma < 1 or step < 1 or n < gamma + step:
        return math.nan
    loss = np.asarray(losses, dtype=np.float64)
    i = np.arange(n - gamma, n)
    return float(np.mean((loss[i - step] - loss[i]) / step))


def softmax(utilities: np.ndarray) -> np.ndarray:
    """Eq. 3: ``exp(U_k) / sum_k exp(U_k)`` (shifted by the maximum, which leaves the ratios unchanged)."""
    u = np.asarray(utilities, dtype=np.float64)
    e = np.exp(u - u.max())
    out: np.ndarray = e / e.sum()
    return out


def sample_model(utilities: np.ndarray, candidates: np.ndarray, rng: np.random.Generator) -> int:
    """Eq. 2: one of ``candidates`` (model ids) drawn with Eq. 3's probabilities of their utilities, by one uniform
    draw from ``rng`` (inverse CDF, so the draw is a function of the generator's state alone)."""
    p = softmax(utilities[candidates])
    k = int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"))
    return int(candidates[min(k, len(candidates) - 1)])


def update_utilities(
    utilities: np.ndarray,
    client_ids: np.ndarray,
    model_ids: np.ndarray,
    losses: np.ndarray,
    similarity: np.ndarray,
) -> np.ndarray:
    """Eq. 4 for one round: every client that trained ``c`` (on model ``M*``) lowers each model's utility by its
    standardised training loss times the model's similarity to ``M*``: ``U_k^c -= z_c sim(M_k, M*)``.

    ``z`` standardises the round's losses over its clients (zero mean, unit variance; 0 when they are all equal, as
    with a single client). Every model of the client is updated, not only the ones compatible this round: ``assign``
    cannot write state, and sampling only ever reads the compatible ones (a client's capacity follows its trace, so
    a model out of reach now may be within reach later, and then its utility carries what similar models taught)."""
    out = np.array(utilities, dtype=np.float64, copy=True)
    if len(client_ids) == 0:
        return out
    loss = np.asarray(losses, dtype=np.float64)
    std = loss.std()
    z = (loss - loss.mean()) / std if std > 0 else np.zeros_like(loss)
    for c, m, zc in zip(client_ids, model_ids, z, strict=True):
        out[int(c)] -= zc * similarity[:, int(m)]
    return out


def cell_params(graph: Graph, op: Op) -> int:
    """Parameters of a cell (weight and bias) at the graph's sizes."""
    c = graph.size(op.dim)
    if op.kind == "dwconv":
        weight = c * op.kernel * op.kernel
    elif op.kind == "linear":
        weight = c * graph.size(op.in_dim) * op.group
    else:
        weight = c * graph.size(op.in_dim) * op.kernel * op.kernel
    return weight + (c if op.bias else 0)


def model_similarity(small: Graph, large: Graph, reset_between: bool) -> float:
    """``sim`` of two models of a family (module docstring): the mean matching degree over ``large``'s cells."""
    if reset_between:
        return 0.0  # every cell scores -1, clipped to 0
    cells = {op.name: op for op in small.cells}
    scores = []
    for op in large.cells:
        mine = cells.get(op.name)
        if mine is None or mine.kind != op.kind:
            scores.append(0.0)  # inserted since: it inherited nothing
        else:
            scores.append(min(1.0, cell_params(small, mine) / cell_params(large, op)))
    return float(np.clip(np.mean(scores), 0.0, 1.0)) if scores else 0.0


def family_similarity(graphs: Sequence[Graph], transforms: Sequence[tuple[str, ...]]) -> np.ndarray:
    """``(M, M)``: ``sim`` of every pair of models (model ``j``'s log extends model ``i``'s for ``i < j``)."""
    m = len(graphs)
    out = np.eye(m)
    for i in range(m):
        for j in range(i + 1, m):
            reset = RESET in transforms[j][len(transforms[i]) :]
            out[i, j] = out[j, i] = model_similarity(graphs[i], graphs[j], reset)
    return out


def input_scales(source: Graph, receiver: Graph) -> dict[str, float]:
    """The factor by which each weight of ``source`` is multiplied before it enters ``receiver``'s leading slice
    (module docstring, "Cropping across a widening"): for every conv or linear cell of both models whose input
    dimension they size differently, ``source size / receiver size`` (``1 / K`` after a widening by ``K``; ``K`` the
    other way). Tensor names are the models' own; weights not listed keep their scale (biases, norms and depthwise
    filters are per output channel and never summed over a widened dimension)."""
    known = {op.name: op for op in source.cells}
    out: dict[str, float] = {}
    for op in receiver.cells:
        if op.kind == "dwconv" or op.name not in known:
            continue
        # the two models may name the input dimension differently (a cell inserted between: its own dimension)
        ratio = source.size(known[op.name].in_dim) / receiver.size(op.in_dim)
        if ratio != 1.0:
            out[tensor_name(op.name, "weight")] = ratio
    return out


def soft_aggregate(
    means: Mapping[int, Params],
    coefficients: Mapping[tuple[int, int], float],
    scales: Mapping[tuple[int, int], Mapping[str, float]] | None = None,
) -> dict[int, Params]:
    """Eq. 5 for every model ``j`` of ``means`` (each model's FedAvg over its own clients this round, under its own
    tensor names): ``w_j = sum_i a_ij w_i / sum_i a_ij`` element-wise, where ``a_ij = coefficients[(i, j)]`` (pairs
    not listed do not share) and a tensor ``w_i`` smaller than ``w_j`` is added into ``w_j``'s leading slice
    ``[:d1, :d2, ...]`` (a larger one is cropped to it), as HeteroFL nests its sub-models; tensors match by name.
    ``scales[(i, j)][name]`` multiplies ``w_i``'s tensor ``name`` on its way into ``w_j`` (``input_scales``; 1 when
    not listed). Sums run in float64 over sources in id order. ``(j, j)`` must be listed and positive, so every
    element has a weight."""
    scales = scales or {}
    out: dict[int, Params] = {}
    for j in sorted(means):
        own_weight = coefficients.get((j, j), 0.0)
        if own_weight <= 0:
            raise ValueError(f"soft_aggregate: model {j} needs a positive weight for its own clients' mean")
        new: Params = {}
        for name, own in means[j].items():
            num = torch.zeros(own.shape, dtype=torch.float64)
            den = torch.zeros(own.shape, dtype=torch.float64)
            for i in sorted(means):
                a = coefficients.get((i, j), 0.0)
                src = means[i].get(name)
                if a <= 0 or src is None or src.dim() != own.dim():
                    continue
                region = tuple(slice(0, min(s, t)) for s, t in zip(src.shape, own.shape, strict=True))
                scale = scales.get((i, j), {}).get(name, 1.0)
                num[region] += a * scale * src[region].to(torch.float64)
                den[region] += a
            new[name] = (num / den).to(own.dtype)
        out[j] = new
    return out


def select_cells(activeness: Mapping[str, float], alpha: float) -> list[str]:
    """Sec. 4.1: the cells whose activeness is at least ``alpha`` times the largest (in the order given)."""
    if not activeness:
        return []
    top = max(activeness.values())
    return [name for name, value in activeness.items() if value >= alpha * top]
