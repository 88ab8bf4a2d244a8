"""The resource model: parameters, bytes on the wire, forward FLOPs and peak training memory of any sub-model.

How it stays exact and fast:

* **Parameters and bytes** come straight from the tensor layouts of the ``SearchSpace``: a tensor's element count is
  a product of (units x group) over its bound axes and its fixed sizes, present only while its gate keeps a unit.
* **FLOPs and activations** come from the family's ``CostUnit`` pieces. Each distinct piece shape is measured once on
  the meta device (no real memory, no real compute): autograd's saved-tensor hooks give the bytes kept for backward
  (each tensor counted once, parameters excluded), ``FlopCounterMode`` the forward FLOPs, at the corners of a small
  box of widths and two batch sizes. These quantities are multilinear in a piece's widths, so the corner values fit
  them exactly; a check at a point off the corners guards that assumption (``UnitFit.check_error``). Fits are cached
  per process and on disk.
* A spec's cost is then a sum of monomials of its unit counts. ``CostModel.evaluate`` computes it for a whole batch of
  specs at once with a few gathers and one matrix product (``benchmarks/cost_model.py`` measures the rate).

Peak training memory at batch ``B`` (the optimizer keeps ``slots`` tensors per parameter: 0 for plain SGD, 1 with
momentum, 2 for Adam/AdamW)::

    overhead + bytes(params) * (2 + slots) + saved_fixed + B * saved_per_sample + transient_factor * B * largest

``largest`` is the largest single activation tensor (per sample) of any piece: the gradient buffer of the activation
being back-propagated is alive on top of what is saved. Counting every parameter gradient and every saved tensor at
once is an upper bound (backward frees saved tensors as it allocates gradients), which is why one ``largest`` is enough
slack: ``benchmarks/cost_model.py`` measures the estimate within 10% on CPU. ``overhead`` is the runtime's own memory
(CUDA context, allocator caches), 0 by default.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from rayfl.models.elastic.family import CostUnit, ElasticFamily

__all__ = ["CostModel", "Costs", "UnitFit", "fit_unit", "optimizer_slots", "saved_tensors", "units_from_ratios"]

_LO, _HI, _CHECK = 4, 8, 6  # widths of the fitting box and of the off-corner check
_MAX_DIMS = 4  # widest monomial: a piece may depend on at most this many dimensions
_CACHE_VERSION = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnitFit:
    """Coefficients of one piece's costs over the monomials of its widths (bitmask order: bit i = dims[i])."""

    flops: np.ndarray  # forward FLOPs per sample
    saved_per_sample: np.ndarray  # bytes saved for backward, per sample
    saved_fixed: np.ndarray  # bytes saved for backward that do not grow with the batch (norm statistics)
    tensors: np.ndarray  # (tensors, monomials): bytes per sample of each saved tensor and of the output
    check_error: float  # relative error of the fit at the off-corner check point (0 when exact)


def saved_tensors(module: nn.Module, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor, float]:
    """Run ``module(x)`` recording the tensors autograd saves for backward, each once and parameters excluded.

    Returns (saved tensors, output, forward FLOPs).
    """
    param_ids = {id(p) for p in module.parameters()}
    saved: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(t) not in param_ids and id(base) not in param_ids:
            saved[id(base)] = base  # holding the reference keeps ids unique while we count
        return t

    # imported here: torch's FLOP counter pulls in triton (about 60 ms and 20 MiB PSS per process), which client
    # hosts and shards never need; only the driver's cost model measures layers
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), counter:
        out = module(x)
    return list(saved.values()), out, float(counter.get_total_flops())


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _measure(unit: CostUnit, widths: tuple[int, ...], batch: int) -> tuple[float, float, list[int]]:
    """(flops, saved bytes, bytes of each saved tensor and of the output) of one forward pass on the meta device."""
    with torch.device("meta"):
        module, make_input = unit.make(widths)
        module.train()
        x = make_input(batch, torch.device("meta"))
    saved, out, flops = saved_tensors(module, x)
    sizes = [_nbytes(t) for t in saved]
    return flops, float(sum(sizes)), [*sizes, _nbytes(out)]


def _two_batches(unit: CostUnit, widths: tuple[int, ...]) -> tuple[float, float, float, list[float]]:
    """(forward FLOPs per sample, saved bytes per sample, saved bytes fixed, per-sample bytes of each saved tensor and
    of the output) from passes at batches 1 and 2, or 2 and 3 where the piece refuses a batch of one (a batch norm
    over one value per channel, e.g. the MLP's). Saved bytes are ``fixed + batch * per``."""
    for lo in (1, 2):
        try:
            flops, saved_lo, _ = _measure(unit, widths, lo)
        except ValueError:
            if lo == 2:
                raise
            continue
        _, saved_hi, sizes = _measure(unit, widths, lo + 1)
        per = saved_hi - saved_lo
        return flops / lo, per, saved_lo - lo * per, [v / (lo + 1) for v in sizes]
    raise AssertionError("unreachable")


def _solve(values: dict[tuple[int, ...], float], k: int) -> np.ndarray:
    """Multilinear coefficients from values at the 2^k corners of [_LO, _HI]^k."""
    masks = list(range(1 << k))
    rows, rhs = [], []
    for corner in itertools.product((_LO, _HI), repeat=k):
        rows.append([np.prod([corner[i] for i in range(k) if m >> i & 1]) for m in masks])
        rhs.append(values[corner])
    return np.linalg.solve(np.array(rows, dtype=np.float64), np.array(rhs, dtype=np.float64))


def _monomials(widths: Sequence[int], k: int) -> np.ndarray:
    return np.array([np.prod([widths[i] for i in range(k) if m >> i & 1]) for m in range(1 << k)], dtype=np.float64)


def fit_unit(unit: CostUnit) -> UnitFit:
    """Measure a piece at the corners of the width box and fit its multilinear cost coefficients."""
    k = len(unit.dims)
    if k > _MAX_DIMS:
        raise ValueError(f"cost piece {unit.key!r} depends on {k} dimensions (at most {_MAX_DIMS})")
    quantities: dict[str, dict[tuple[int, ...], float]] = {q: {} for q in ("flops", "per", "fixed")}
    sizes: dict[tuple[int, ...], list[float]] = {}
    for corner in itertools.product((_LO, _HI), repeat=k):
        (quantities["flops"][corner], quantities["per"][corner], quantities["fixed"][corner], sizes[corner]) = (
            _two_batches(unit, corner)
        )
    coef = {q: _solve(v, k) for q, v in quantities.items()}
    counts = {len(v) for v in sizes.values()}
    if len(counts) != 1:
        raise ValueError(f"cost piece {unit.key!r} saves a different number of tensors at different widths")
    # each tensor's size, per sample (tensors are the same sequence at every width)
    tensors = np.array([_solve({c: v[t] for c, v in sizes.items()}, k) for t in range(counts.pop())])
    check = (_CHECK,) * k
    f, per, fixed, _ = _two_batches(unit, check)
    mono = _monomials(check, k)
    predicted = np.array([coef["flops"] @ mono, coef["per"] @ mono + coef["fixed"] @ mono])
    measured = np.array([f, per + fixed])
    err = float(np.max(np.abs(predicted - measured) / np.maximum(measured, 1.0)))
    return UnitFit(coef["flops"], coef["per"], coef["fixed"], tensors, err)


# ---------------------------------------------------------------------------------------------- fit cache
_FITS: dict[str, UnitFit] = {}


def _cache_file() -> Path:
    root = Path(os.environ.get("RAYFL_CACHE", Path.home() / ".cache" / "rayfl"))
    return root / "cost" / f"fits-v{_CACHE_VERSION}-torch{torch.__version__.split('+')[0]}.json"


def _key_id(key: object) -> str:
    return hashlib.sha1(repr(key).encode()).hexdigest()


def _load_disk() -> dict[str, UnitFit]:
    """The fits cached on disk; a file that is not a cache this version wrote (damaged, hand-edited, valid JSON of
    another shape) is ignored with a warning: its pieces are measured again and the file rewritten."""
    path = _cache_file()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("cost model cache %s cannot be read (%s): measuring again", path, err)
        return {}
    try:
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON {type(raw).__name__}, not an object")
        return {str(kid): _fit_from_json(d) for kid, d in raw.items()}
    except (ValueError, TypeError, KeyError) as err:
        log.warning("cost model cache %s is damaged (%s): ignoring it and measuring again", path, err)
        return {}


def _fit_from_json(d: object) -> UnitFit:
    """One cached fit, its arrays checked for the shapes ``fit_unit`` makes (2^k monomials, k <= _MAX_DIMS)."""
    if not isinstance(d, dict):
        raise ValueError(f"an entry is a JSON {type(d).__name__}, not an object")
    arrays = {f: np.array(d[f], dtype=np.float64) for f in ("flops", "saved_per_sample", "saved_fixed", "tensors")}
    monomials = arrays["flops"].shape
    if len(monomials) != 1 or monomials[0] not in {1 << k for k in range(_MAX_DIMS + 1)}:
        raise ValueError(f"flops of shape {monomials}")
    for name in ("saved_per_sample", "saved_fixed"):
        if arrays[name].shape != monomials:
            raise ValueError(f"{name} of shape {arrays[name].shape}, flops {monomials}")
    tensors = arrays["tensors"]
    if tensors.size == 0:
        tensors = tensors.reshape(0, monomials[0])
    elif tensors.ndim != 2 or tensors.shape[1] != monomials[0]:
        raise ValueError(f"tensors of shape {tensors.shape}, flops {monomials}")
    if not all(np.isfinite(a).all() for a in arrays.values()):
        raise ValueError("a non-finite coefficient")
    err = d["err"]
    if isinstance(err, bool) or not isinstance(err, int | float):
        raise ValueError(f"err is {err!r}")
    return UnitFit(arrays["flops"], arrays["saved_per_sample"], arrays["saved_fixed"], tensors, float(err))


def _store_disk(fits: dict[str, UnitFit]) -> None:
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = {
            kid: {
                "flops": f.flops.tolist(),
                "saved_per_sample": f.saved_per_sample.tolist(),
                "saved_fixed": f.saved_fixed.tolist(),
                "tensors": f.tensors.tolist(),
                "err": f.check_error,
            }
            for kid, f in fits.items()
        }
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(raw))
        tmp.replace(path)  # atomic: concurrent writers never leave a torn file
    except OSError:
        return  # a read-only home only costs a re-measurement next time


def cached_fit(unit: CostUnit, use_disk: bool = True) -> UnitFit:
    kid = _key_id(unit.key)
    if kid not in _FITS and use_disk and not _FITS:
        _FITS.update(_load_disk())
    if kid in _FITS and len(_FITS[kid].flops) != 1 << len(unit.dims):  # a cache entry of another piece's shape
        log.warning("cost model cache: the fit of piece %r has the wrong shape: measuring it again", unit.key)
        del _FITS[kid]
    if kid not in _FITS:
        _FITS[kid] = fit_unit(unit)
        if use_disk:
            _store_disk(_FITS)
    return _FITS[kid]


# ---------------------------------------------------------------------------------------------- evaluation
_TermGroup = tuple[np.ndarray, np.ndarray]  # (factor columns (terms, degree), coefficients (terms, quantities))


def _group_terms(keys: list[tuple[int, ...]], coefs: list[np.ndarray]) -> list[_TermGroup]:
    """Group terms by their number of factors, so evaluation does exactly that many gathers per term."""
    by_degree: dict[int, list[int]] = {}
    for t, key in enumerate(keys):
        by_degree.setdefault(len(key), []).append(t)
    groups: list[_TermGroup] = []
    for degree, terms in sorted(by_degree.items()):
        idx = np.array([keys[t] for t in terms], dtype=np.int64).reshape(len(terms), degree)
        groups.append((idx, np.array([coefs[t] for t in terms], dtype=np.float64)))
    return groups


def _monomial_columns(cols: np.ndarray, keys: list[tuple[int, ...]]) -> np.ndarray:
    """(n, len(keys)): each monomial's value (product of its factor columns; 1 for the empty product)."""
    out = np.ones((len(cols), len(keys)))
    width = max((len(k) for k in keys), default=0)
    for j in range(width):
        present = [i for i, k in enumerate(keys) if len(k) > j]
        out[:, present] *= cols[:, [keys[i][j] for i in present]]
    return out


def _sum_terms(cols: np.ndarray, groups: list[_TermGroup]) -> np.ndarray:
    """(n, quantities): for each spec, the sum over terms of coef * product of its factor columns."""
    total: np.ndarray | None = None
    for idx, coef in groups:
        if idx.shape[1] == 0:
            part = np.broadcast_to(coef.sum(axis=0), (len(cols), coef.shape[1]))
        else:
            mono = cols[:, idx[:, 0]]
            for j in range(1, idx.shape[1]):
                mono *= cols[:, idx[:, j]]
            part = mono @ coef
        total = part.copy() if total is None else total + part
    assert total is not None
    return total


def optimizer_slots(optimizer: str, momentum: float = 0.0) -> int:
    """Tensors of optimizer state per parameter."""
    if optimizer in ("adam", "adamw"):
        return 2
    if optimizer == "sgd":
        return 1 if momentum > 0 else 0
    raise ValueError(f"unknown optimizer {optimizer!r}")


def units_from_ratios(ratios: np.ndarray, sizes: np.ndarray, skippable: np.ndarray) -> np.ndarray:
    """Vectorised ``units_for``: (n, D) ratios → (n, D) unit counts (ceil, at least 1, 0 only where skippable)."""
    r = np.asarray(ratios, dtype=np.float64)
    if (r > 1.0).any() or ((r <= 0.0) & ~skippable).any():
        raise ValueError("ratios must be in (0, 1], and 0 only for skippable dimensions")
    units = np.clip(np.ceil(r * sizes - 1e-9), 1, sizes)
    return np.where(r <= 0.0, 0, units).astype(np.int64)


@dataclass(frozen=True)
class Costs:
    """Costs of a batch of specs (arrays of shape (n,))."""

    params: np.ndarray
    bytes_down: np.ndarray
    bytes_up: np.ndarray
    flops: np.ndarray  # forward FLOPs per sample
    peak_memory: np.ndarray  # bytes at the model's batch size

    def __getitem__(self, i: int) -> dict[str, float]:
        return {f: float(getattr(self, f)[i]) for f in ("params", "bytes_down", "bytes_up", "flops", "peak_memory")}


class CostModel:
    """Vectorised costs of sub-models of one family, for one training set-up (batch, optimizer, dtype)."""

    def __init__(
        self,
        family: ElasticFamily,
        batch_size: int,
        optimizer: str = "sgd",
        momentum: float = 0.9,
        dtype_bytes: int = 4,
        overhead_bytes: float = 0.0,
        transient_factor: float = 1.0,
        upload_compression: float | Callable[[np.ndarray], np.ndarray] = 1.0,
        use_disk_cache: bool = True,
    ) -> None:
        """``upload_compression``: a factor on upload bytes, or a function of the parameter counts (e.g. QSGD)."""
        self.family = family
        self.batch_size = batch_size
        self.dtype_bytes = dtype_bytes
        self.overhead_bytes = overhead_bytes
        self.transient_factor = transient_factor
        self.slots = optimizer_slots(optimizer, momentum)
        self.upload_compression = upload_compression
        space = family.space
        self.num_dims = len(space.dims)
        d = self.num_dims
        # Every cost is a sum of terms  coef * product of factors, where a factor is a unit count u[i] or a gate
        # [u[g] > 0]; factors index the columns of [u, 1, u > 0] (column d is the constant 1).
        summed: dict[tuple[int, ...], np.ndarray] = {}  # factors -> (params, flops, saved per sample, saved fixed)

        def factors(dims: tuple[int, ...], gate: int | None) -> tuple[int, ...]:
            if gate is None or gate in dims:  # a unit count of 0 already zeroes the term
                return tuple(sorted(dims))
            return (*sorted(dims), d + 1 + gate)

        def add(key: tuple[int, ...], values: np.ndarray) -> None:
            summed[key] = summed.get(key, np.zeros(4)) + values

        for lay in space.layouts.values():
            coef, dims = 1.0, []
            for size, ax in zip(lay.shape, lay.axes, strict=True):
                if ax is None:
                    coef *= size
                else:
                    coef *= ax.group
                    dims.append(ax.dim)
            add(factors(tuple(dims), lay.gate), np.array([coef, 0.0, 0.0, 0.0]))
        self.fits: list[UnitFit] = []
        candidates: set[tuple[tuple[tuple[int, ...], float], ...]] = set()  # distinct activation tensor sizes
        for unit in family.cost_units():
            fit = cached_fit(unit, use_disk_cache)
            self.fits.append(fit)
            k = len(unit.dims)
            keys = [factors(tuple(unit.dims[i] for i in range(k) if m >> i & 1), unit.gate) for m in range(1 << k)]
            for m, key in enumerate(keys):
                values = np.array([0.0, fit.flops[m], fit.saved_per_sample[m], fit.saved_fixed[m]])
                if np.any(np.abs(values) > 1e-6):
                    add(key, values)
            for row in fit.tensors:
                candidates.add(tuple((keys[m], round(float(c), 6)) for m, c in enumerate(row) if abs(c) > 1e-6))
        self.max_check_error = max((f.check_error for f in self.fits), default=0.0)
        self._groups = _group_terms(list(summed), [summed[k] for k in summed])
        # Largest tensor: a tensor whose size is one monomial only competes with the largest coefficient of that
        # monomial; the max is then taken over monomial columns (and over the rare multi-monomial tensors).
        single: dict[tuple[int, ...], float] = {}
        multi = [cand for cand in candidates if len(cand) > 1]
        for cand in candidates:
            if len(cand) == 1:
                key, c = cand[0]
                single[key] = max(single.get(key, 0.0), c)
        mono_keys = sorted(set(single) | {key for cand in multi for key, _ in cand})
        where = {key: i for i, key in enumerate(mono_keys)}
        matrix = np.zeros((len(mono_keys), len(single) + len(multi)))
        for j, key in enumerate(sorted(single)):
            matrix[where[key], j] = single[key]
        for j, cand in enumerate(sorted(multi), start=len(single)):
            for key, c in cand:
                matrix[where[key], j] += c
        self._largest_keys = mono_keys
        self._largest_groups = _group_terms(mono_keys, list(np.eye(len(mono_keys))) if mono_keys else [])
        self._largest_matrix = matrix
        self._largest_coef = np.array([single[k] for k in mono_keys]) if not multi else None

    def evaluate(self, units: np.ndarray, chunk: int = 4096) -> Costs:
        """Costs of ``units`` ((n, D) or (D,) unit counts per dimension)."""
        u = np.atleast_2d(np.asarray(units, dtype=np.float64))
        if u.shape[1] != self.num_dims:
            raise ValueError(f"expected {self.num_dims} unit counts per spec, got {u.shape[1]}")
        parts = [self._evaluate(u[i : i + chunk]) for i in range(0, len(u), chunk)]
        return Costs(*(np.concatenate([p[j] for p in parts]) for j in range(5)))

    def evaluate_ratios(self, ratios: np.ndarray) -> Costs:
        space = self.family.space
        return self.evaluate(units_from_ratios(np.atleast_2d(ratios), space.sizes, space.skippable))

    def _evaluate(self, u: np.ndarray) -> tuple[np.ndarray, ...]:
        n = len(u)
        cols = np.empty((n, 2 * self.num_dims + 1))
        cols[:, : self.num_dims] = u
        cols[:, self.num_dims] = 1.0
        np.greater(u, 0.0, out=cols[:, self.num_dims + 1 :])
        params, flops, per, fixed = _sum_terms(cols, self._groups).T
        if not self._largest_matrix.size:
            biggest = np.zeros(n)
        elif self._largest_coef is not None:
            biggest = (_monomial_columns(cols, self._largest_keys) * self._largest_coef).max(axis=1)
        else:
            biggest = (_sum_terms(cols, self._largest_groups) @ self._largest_matrix).max(axis=1)
        b = self.batch_size
        param_bytes = params * self.dtype_bytes
        memory = (
            self.overhead_bytes + param_bytes * (2 + self.slots) + fixed + b * per + self.transient_factor * b * biggest
        )
        comp = self.upload_compression
        up = param_bytes * (comp(params) if callable(comp) else comp)
        return params, param_bytes, up, flops, memory

    def model_cost(self, units: Sequence[int]) -> dict[str, float]:
        return self.evaluate(np.asarray(units)[None, :])[0]
