"""HeteroFL: Computation and Communication Efficient Federated Learning for Heterogeneous Clients.

Diao, Ding, Tarokh, ICLR 2021 (arXiv:2010.01264).

Each client trains the leading ``ceil(rate x width)`` units of every dimension (first-k), at the largest rate of
``rates`` whose uniform sub-model fits its memory and bandwidth budgets; the server takes the count-normalised
element-wise mean (uncovered elements keep their value). ``label_mask``: absent classes' logits are 0 in the local loss
and the classifier rows of a client's labels only are aggregated (``rates.UniformRates``).

**Static batch norm** (``static_bn``; official ``train_classifier_fed.py`` ``stats``). Clients' batch norms use batch
statistics only (the families build them with ``track_running_stats=False``), so no running statistics are trained,
sent or aggregated. For evaluation the server builds a copy of the global model whose batch norms track statistics,
loads the global weights, runs it in training mode under ``no_grad`` over the whole pooled training set
(``ServerContext.dataset``, in client-major order) and hands the running means and variances to the engine together
with the weights (``eval_params``); the hosts evaluate with such a tracked copy (``eval_model``), in eval mode, so the
test set is normalised with the training-set statistics. Models without batch norm (or with ``static_bn: false``) are
evaluated as they are. The server seconds spent go to ``RoundStats.server_train_s``. The pass is computed in chunks
of many batches per forward, each batch still normalised with its own statistics (``static_bn_statistics``; issue
41): the statistics equal the batch-by-batch pass's to float rounding (largest gap 6.6e-07 on the CPU settings 1
and 3) in about half its time (``python benchmarks/static_bn.py``). It runs once per evaluated state: the tracked
copy is built once, and the statistics of the last evaluated state are kept, so the end-of-run export of that state
(``engine/persist/export.py``, which asks ``eval_params`` again) reuses them instead of a second pass.

Choices where the paper and the code leave room:

* **Cumulative average weighted by samples.** PyTorch's ``momentum=None`` averages batch statistics with equal weight
  per batch; here each batch's statistics enter with the weight of its sample count (the momentum of a batch of ``b``
  samples after ``seen`` samples is ``b / seen``). With equal batches this is exactly the official average; with a
  smaller last batch the running mean of the first norm is then exactly the mean over the training set. The running
  variance is the sample-weighted mean of the batches' unbiased variances, as PyTorch defines it.
* **Batches.** As the official code (a shuffled loader over the pooled training set, batch size 10), the pool is
  permuted by ``derive_rng(seed, "static_bn", round)`` (``static_bn_shuffle``; off: client-major order) and cut into
  ``max(1, n // static_bn_batch_size)`` nearly equal batches (default size 10), so no batch is smaller than the batch
  size and none has a single sample. On label-skewed data the order matters: client-major batches hold one client's
  labels each and give a different running variance.
* **Privacy.** As in the official code, the statistics come from the pooled training set (the core paper notes that a
  real deployment would have to query clients for them).
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from rayfl.core.cores import usable_cores
from rayfl.core.messages import Params, ServerState
from rayfl.core.rng import derive_rng
from rayfl.data.federated import Rows
from rayfl.fl.common.init import official_init
from rayfl.fl.common.rates import UniformRateHooks, UniformRates, with_clip
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.models.elastic.spec import FirstK, Selector
from rayfl.models.inputs import InputSpec, has_dropout, to_input

if TYPE_CHECKING:
    from rayfl.config.sections import TrainConfig
    from rayfl.models.elastic.family import ElasticFamily

__all__ = ["HeteroFL", "static_bn_statistics", "static_bn_statistics_sequential", "tracked_global_model"]

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_STAT_SUFFIXES = (".running_mean", ".running_var")
# samples per forward of the static-BN pass (at least one batch): on the CPU settings 1 and 3, one thread, smaller
# chunks (128-256) took as much CPU time and 2,000-4,000 samples per forward were slower
STATIC_BN_CHUNK = 512


def tracked_global_model(family: ElasticFamily) -> nn.Module | None:
    """The full model with batch norms that track running statistics (reset to mean 0, variance 1, uninitialised
    weights), or ``None`` when the model has no batch norm or its family cannot build tracking copies."""
    if "track_stats" not in inspect.signature(family.build).parameters:
        return None
    with torch.device("meta"):  # no wasted random init: every weight is loaded by the caller
        model: nn.Module = cast(Any, family).build(family.full_units, track_stats=True)
    norms = [m for m in model.modules() if isinstance(m, _BATCH_NORMS)]
    if not norms or not all(m.track_running_stats for m in norms):
        return None
    model = model.to_empty(device="cpu")
    for m in norms:
        m.reset_running_stats()
    return model


def static_bn_batches(n: int, batch_size: int, rng: np.random.Generator | None) -> list[np.ndarray]:
    """The static-BN pass's batches of sample indices: a permutation drawn from ``rng`` (``None``: client-major order)
    cut into ``max(1, n // batch_size)`` nearly equal consecutive pieces."""
    if batch_size < 1:
        raise ValueError(f"algorithm.static_bn_batch_size must be at least 1, got {batch_size}")
    order = np.arange(n) if rng is None else rng.permutation(n)
    return list(np.array_split(order, max(1, n // batch_size)))


def static_bn_statistics(
    model: nn.Module,
    x: Rows,
    input_spec: InputSpec,
    batch_size: int,
    rng: np.random.Generator | None = None,
    chunk: int = STATIC_BN_CHUNK,
    workers: int = 1,
) -> Params:
    """Running means and variances of every batch norm of ``model`` over the samples ``x`` (see module docstring),
    in the batches of ``static_bn_batches``; ``model`` must hold the weights and track statistics. Returns the
    ``*.running_mean`` / ``*.running_var`` entries.

    In training mode a batch's forward depends on that batch alone (each batch norm normalises it with its own
    statistics), so the batches need not run one by one: consecutive batches of one size run together, up to
    ``chunk`` samples at a time, with every batch norm replaced for the pass by one that normalises each batch of the
    chunk with that batch's statistics and adds them, weighted by its sample count, to the running statistics. The
    result is the one-batch-at-a-time pass's (``static_bn_statistics_sequential``) to float rounding (a sum instead
    of a running update), at a fraction of its calls (issue 41). Exact for models whose only operation across samples
    is batch norm (rayfl's families; dropout would draw other masks); a model with dropout runs batch by batch.

    A chunk's rows are sample-major (row ``s * k + g`` is sample ``s`` of the chunk's batch ``g``, of ``k``), an order
    no operation but batch norm can tell from batch-major, so that each batch norm reads its input as one batch of
    ``b`` samples with the ``k`` batches' channels side by side without copying it (``_PerBatchNorm``); the pass runs
    under ``torch.inference_mode``.

    ``workers`` > 1 runs the chunks on that many Python threads at once (torch releases the interpreter lock in its
    kernels), each at one intra-op thread, and adds the chunks' sums in chunk order afterwards: every chunk is computed
    as on one thread and the sums are added in the same order, so the statistics are the same bits whatever
    ``workers`` is. Only where this process computes on one intra-op thread (``backend.server_threads`` 1, the
    default); with more the pass stays on them, as before."""
    norms = [(name, m) for name, m in model.named_modules() if isinstance(m, _BATCH_NORMS)]
    n = len(x)
    if n == 0:
        raise ValueError("static BN needs training samples")
    batches = static_bn_batches(n, batch_size, rng)
    if has_dropout(model):
        return static_bn_statistics_sequential(model, x, input_spec, batches)
    model.train()
    grouped = {name: _PerBatchNorm(name, m) for name, m in norms}
    runs = _same_size_runs(batches, max(1, chunk))
    workers = max(1, min(workers, len(runs))) if torch.get_num_threads() == 1 else 1

    def forward(run: tuple[int, list[np.ndarray]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        size, members = run
        if workers > 1:  # a pool thread takes torch's thread count lazily: one intra-op thread from its first op
            torch.set_num_threads(1)
        sums: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        _PerBatchNorm.local.batch, _PerBatchNorm.local.sums = size, sums
        rows = np.stack([np.sort(b) for b in members], axis=1).reshape(-1)  # sample-major (see above)
        with torch.inference_mode():  # per thread, as grad modes are
            model(to_input(x[rows], input_spec))
        return sums

    mean_sum = {name: torch.zeros(m.num_features, dtype=torch.float64) for name, m in norms}
    var_sum = {name: torch.zeros(m.num_features, dtype=torch.float64) for name, m in norms}
    _swap(model, grouped)
    try:
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rayfl-static-bn") if workers > 1 else None
        try:
            # the chunks' sums added in chunk order, whatever thread made them (``Executor.map`` keeps the order)
            for sums in pool.map(forward, runs) if pool is not None else map(forward, runs):
                for name, (mean, var) in sums.items():
                    mean_sum[name] += mean
                    var_sum[name] += var
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
    finally:
        _swap(model, {name: m for name, m in norms})
    with torch.no_grad():
        for name, m in norms:
            assert m.running_mean is not None and m.running_var is not None and m.num_batches_tracked is not None
            m.running_mean.copy_(mean_sum[name] / n)
            m.running_var.copy_(var_sum[name] / n)
            m.num_batches_tracked.fill_(len(batches))
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k.endswith(_STAT_SUFFIXES)}


def static_bn_statistics_sequential(
    model: nn.Module, x: Rows, input_spec: InputSpec, batches: list[np.ndarray]
) -> Params:
    """The same statistics one batch at a time through the model's own batch norms (cumulative average weighted by
    samples); the reference ``static_bn_statistics`` is checked against, and its path for models with dropout."""
    norms = [m for m in model.modules() if isinstance(m, _BATCH_NORMS)]
    for m in norms:
        m.reset_running_stats()
    model.train()
    seen = 0
    with torch.no_grad():
        for rows in batches:
            seen += len(rows)
            for m in norms:
                m.momentum = len(rows) / seen  # cumulative average weighted by samples
            model(to_input(x[np.sort(rows)], input_spec))
    for m in norms:
        m.momentum = None
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k.endswith(_STAT_SUFFIXES)}


def _same_size_runs(batches: list[np.ndarray], chunk: int) -> list[tuple[int, list[np.ndarray]]]:
    """Consecutive batches of one size, at most ``chunk`` samples (and at least one batch) per run."""
    runs: list[tuple[int, list[np.ndarray]]] = []
    for b in batches:
        if runs and runs[-1][0] == len(b) and (len(runs[-1][1]) + 1) * len(b) <= chunk:
            runs[-1][1].append(b)
        else:
            runs.append((len(b), [b]))
    return runs


def _swap(model: nn.Module, modules: Mapping[str, nn.Module]) -> None:
    """Put each of ``modules`` in ``model`` under its dotted name."""
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, module)


class _PerBatchNorm(nn.Module):
    """Training-mode batch norm of a chunk of equal batches of ``local.batch`` samples in sample-major order (row
    ``s * k + g``: sample ``s`` of batch ``g``), each batch normalised with its own statistics (as the wrapped norm
    would normalise it alone); puts the sums over the chunk's batches of each batch's mean and unbiased variance,
    times its sample count, in float64, into ``local.sums[name]``. ``local`` is per thread, so threads can run
    chunks through one model at once."""

    local = threading.local()

    def __init__(self, name: str, norm: nn.modules.batchnorm._BatchNorm) -> None:
        super().__init__()
        self.name = name
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, norm = self.local.batch, self.norm
        groups = x.shape[0] // b
        # the batches side by side as channels of one batch, (samples, batches x channels, positions): a view of the
        # sample-major rows; the native kernel normalises each (batch, channel) over its own samples and positions,
        # exactly as it would the batch alone
        folded = x.reshape(b, groups * x.shape[1], -1)
        if b * folded.shape[2] < 2:
            raise ValueError(f"static BN: a batch of {b} gives one value per channel (static_bn_batch_size too small)")
        mean = torch.zeros(folded.shape[1], dtype=x.dtype)
        var = torch.ones(folded.shape[1], dtype=x.dtype)
        weight = None if norm.weight is None else norm.weight.repeat(groups)
        bias = None if norm.bias is None else norm.bias.repeat(groups)
        y = nn.functional.batch_norm(folded, mean, var, weight, bias, training=True, momentum=1.0, eps=norm.eps)
        self.local.sums[self.name] = (
            mean.double().view(groups, -1).sum(0) * b,  # momentum 1: the batches' own statistics
            var.double().view(groups, -1).sum(0) * b,  # (the running variance: unbiased)
        )
        return y.reshape(x.shape)


class HeteroFL(UniformRateHooks, SubModelAlgorithm):
    """First-k sub-models at the largest fitting rate, label masking and static BN (see module docstring)."""

    name = "heterofl"
    config: HeteroFLConfig

    def __init__(self, config: HeteroFLConfig, train: TrainConfig) -> None:
        super().__init__(
            config, with_clip(train, config.grad_clip_norm), distill=config.distill, distill_space=config.rates
        )
        self.uniform = UniformRates(self.name, config.rates, config.label_mask)
        self._tracked: nn.Module | None = None  # the static-BN pass's tracked copy, built on first use
        # the last pass: the parameters it ran on (held, so that ``is`` cannot match a newer dict at a reused
        # address), their round and the statistics it gave
        self._evaluated: tuple[Params, int, Params] | None = None

    def bind_client(self, family: ElasticFamily | None, input_spec: InputSpec) -> None:
        super().bind_client(family, input_spec)
        self._tracked, self._evaluated = None, None  # another family: another tracked copy

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_tracked"], state["_evaluated"] = None, None  # driver-only, as the server context
        return state

    def selector(self, round_idx: int, client_id: int) -> Selector:
        return FirstK()

    def init_state(self, params: Params) -> ServerState:
        if not self.config.official_init or self.family is None:
            return ServerState(params=params)
        return ServerState(params=official_init(self.family, params))

    def _static_bn_model(self) -> nn.Module | None:
        if not self.config.static_bn or self.family is None:
            return None
        return tracked_global_model(self.family)

    # capabilities.EvalModel and EvalParams: static BN's tracked copy and the statistics it evaluates with
    def eval_model(self) -> nn.Module | None:
        return self._static_bn_model()

    def eval_params(self, state: ServerState) -> Params:
        """The global parameters with the static-BN statistics of ``state``'s model. Computed once per state: asked
        again for the state of the last pass (the same parameter dict, which a server update never changes in
        place, and round), the statistics of that pass are returned."""
        kept = self._evaluated
        if kept is not None and kept[0] is state.params and kept[1] == state.round_idx:
            return {**state.params, **kept[2]}
        if self._tracked is None:
            self._tracked = self._static_bn_model()
        model = self._tracked
        if model is None:
            return state.params
        began = time.perf_counter()
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                if name.endswith(_STAT_SUFFIXES) or not tensor.is_floating_point():
                    continue
                if name not in state.params:
                    raise KeyError(f"static BN: the global parameters lack {name!r}")
                tensor.copy_(state.params[name])
        ctx = self.server
        cfg = self.config
        rng = derive_rng(ctx.seed, "static_bn", state.round_idx) if cfg.static_bn_shuffle else None
        workers = cfg.static_bn_workers or usable_cores()
        stats = static_bn_statistics(
            model, ctx.dataset.x, ctx.input_spec, cfg.static_bn_batch_size, rng, workers=workers
        )
        spent = time.perf_counter() - began
        previous = self._server_train_s
        self._server_train_s = spent if math.isnan(previous) else previous + spent
        self._evaluated = (state.params, state.round_idx, stats)
        return {**state.params, **stats}
