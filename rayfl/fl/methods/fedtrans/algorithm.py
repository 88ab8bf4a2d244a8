"""FedTrans: efficient federated learning via multi-model transformation.

Zhu, Liu, Chowdhury, Lai, MLSys 2024 (paper 002); author code ``evofed/FedScale`` branch ``dev`` (ALGORITHMS.md
section 9). The run starts with one ``cellnet`` model and grows a family of models from it (the engine's several
global models, ``fl/common/multimodel.py``); the equations are in ``fedtrans_math.py``. Per round (Algorithm 1):

1. **Assignment** (Sec. 4.2, Eq. 2-3). A client's compatible models are those whose training FLOPs for its round
   (3 x forward FLOPs x samples, the clock's own figure) fit its compute budget; it trains one drawn with
   probability ``softmax`` of its utilities over them, from ``derive_rng(seed, "fedtrans-assign", round, client)``
   (model 0 when none fits, as the author code). Clients report each cell's ``|mean gradient| / |weight|`` over their
   local steps (``ClientUpdate.metrics``).
2. **Aggregation** (Sec. 4.3, Eq. 5). The engine's sharded reduction gives each model the sample-weighted mean of its
   own clients (deterministic for any host and shard count); then every model ``j`` that had clients takes
   ``sum_i a_ij w_i / sum_i a_ij`` over the models ``i`` trained this round, with ``a_jj = 1`` and, for a smaller
   model ``i < j`` (larger ones too with ``share_large_to_small``), ``a_ij = eta^t sim(M_i, M_j)``, ``t`` the rounds
   ``j`` has trained, smaller tensors added into the leading slice of larger ones (their input columns of a widened
   dimension rescaled to the receiver's, ``rescale_cropped``). A model without clients this
   round keeps its weights (the author code skips it). This cross-model step runs on the driver after the sharded
   reduction: its coefficients change every round and with every new model, and the shards have no per-round input
   besides the hosts' partial sums; the driver holds every model's tensors anyway.
3. **Utilities** (Eq. 4) from the round's standardised training losses and the models' similarity.
4. **Transformation** (Sec. 4.1, Eq. 1). The newest model's per-round training loss gives its DoC; when
   ``DoC <= beta`` (or at a forced round) the newest model's cells with activeness >= ``alpha`` x the largest
   (averaged over its last ``activeness_rounds`` rounds; the classifier is not a candidate unless
   ``transform_classifier``) are widened by ``widen_factor``, or deepened if their own last transformation was a
   widening (the author code's alternation per cell), and the copy of the newest model with
   those transformations (``models/cellnet/transform.py``: function preserving, noise on widened copies) is added;
   its utility column is the parent's. At most ``max_models`` models, none after the run's last round.

Evaluation scores every model on the test set and each client on its compatible model of highest utility (ties: the
smaller model), paper 002's average client accuracy. Everything that later rounds read lives in ``ServerState``:
the models (``models``, ``params``) and ``FedTransState`` (utilities, similarity, loss history, activeness buffer,
alternation set, per-model trained rounds, transformation log); the FLOPs cache on the algorithm is rebuilt from them.

Paper vs author code vs rayfl (``experiments/fedtrans/README.md`` has the reasons at length):

* DoC (Eq. 1): paper signed slopes ``L(i - d) - L(i)``; author mean of absolute differences; rayfl signed (paper).
* Similarity: paper "cumulates" the cells' ``mc`` into [0, 1]; author sums and divides each row by its maximum;
  rayfl the mean over the larger model's cells, clipped to [0, 1] (``fedtrans_math``).
* Eq. 5's denominator: paper ``sum sim`` (no decay); author and rayfl the sum of the coefficients used.
* Eq. 5's decay: paper ``eta^t`` at round ``t``; author ``1 / t`` with ``t`` the rounds the receiver trained; rayfl
  ``eta^t`` with the author's ``t`` (at the paper's round ``t`` a model made after round 50 would get 0.9^50 = 0.5 %).
* Eq. 5's crop: paper leading slice as is; rayfl rescales a widened dimension's input columns (``rescale_cropped``).
* Eq. 4: paper and author update the client's compatible models; rayfl every model (``update_utilities``; the same
  when capacities are fixed per client).
* Candidates: paper every cell; author and rayfl not the classifier (``transform_classifier`` makes it one).
* Deepen: paper an identity cell; author conv + new batch norm + Dirac conv (linear: an identity linear); rayfl the
  identity cell alone, after the cell's ReLU where it has one (a fresh batch norm is not the identity in training).
* Widen: paper random columns; author and rayfl channel ``j`` copies ``j mod C`` (old channels first); author noise
  5 % of each filter's std on the copies and noisy batch-norm copies; rayfl ``noise`` x the whole tensor's std on the
  copies, batch norm duplicated exactly.
* Sampling: author turns utility 0 into 0.1 and samples only among non-converged models; rayfl neither (paper).
* Aggregation: author stops taking other models once a model converges; rayfl does not (the decay does that).
* Activeness: author over clients able to train the model, last 5 rounds; rayfl the sample-weighted mean of the
  newest model's own clients over its last ``activeness_rounds`` rounds (what the server sees of that model).
* Forced rounds (author ``--enforce_transform``): skipped, with a warning, when the newest model has not trained
  since it was made (no activeness to choose cells by).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from rayfl.config.model import CellNetConfig, ModelConfig, as_model_config, as_model_configs
from rayfl.core.messages import (
    Aggregate,
    Assignment,
    ClientOutcome,
    ClientUpdate,
    ClientView,
    Params,
    ServerState,
)
from rayfl.core.rng import derive_rng, derive_seed
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.multimodel import add_model, initial_model_params, model_key, model_params
from rayfl.fl.methods.fedtrans.config import FedTransConfig
from rayfl.fl.methods.fedtrans.equations import (
    degree_of_convergence,
    family_similarity,
    input_scales,
    sample_model,
    select_cells,
    soft_aggregate,
    update_utilities,
)
from rayfl.models.cellnet.graph import CLASSES, Graph
from rayfl.models.cellnet.module import CellNet
from rayfl.models.cellnet.transform import RESET, build_graph, deepen_step, transform_params, widen_step
from rayfl.system.work import samples_per_round

__all__ = ["ACTIVENESS_PREFIX", "FedTrans", "FedTransState", "Transformation"]

log = logging.getLogger(__name__)

ACTIVENESS_PREFIX = "act/"  # a client's metric "act/<cell>": the cell's |mean gradient| / |weight| this round


@dataclass(frozen=True)
class Transformation:
    """One new model: made after round ``round_idx`` from ``parent`` by ``steps``, at the parent's DoC ``doc``."""

    round_idx: int
    parent: int
    child: int
    doc: float
    forced: bool
    steps: tuple[str, ...]


@dataclass(frozen=True)
class FedTransState:
    """FedTrans's server state besides the models (see the module docstring)."""

    utilities: np.ndarray  # (clients, models): U_k^c
    similarity: np.ndarray  # (models, models): sim(M_i, M_j)
    losses: tuple[float, ...] = ()  # the newest model's training loss per round it trained, since it was made
    activeness: tuple[tuple[tuple[str, float], ...], ...] = ()  # the newest model's cell activeness, last rounds
    widened: frozenset[str] = frozenset()  # cells whose last transformation was a widening: deepened when picked
    trained_rounds: tuple[int, ...] = (0,)  # per model: rounds it aggregated (the t of Eq. 5's decay)
    doc: float = math.nan  # the newest model's DoC after the last round
    log: tuple[Transformation, ...] = ()


class FedTrans(Algorithm):
    """Multi-model transformation, utility-based assignment and soft aggregation (module docstring)."""

    name = "fedtrans"
    config: FedTransConfig

    def __init__(self, config: Any, train: Any) -> None:
        super().__init__(config, train)
        self._flops: dict[ModelConfig, float] = {}  # training FLOPs per sample of each architecture (a cache)

    # ------------------------------------------------------------------------------------------ set-up
    def _base(self) -> CellNetConfig:
        model = self.server.model
        if not isinstance(model, CellNetConfig):
            name = getattr(model, "name", None)
            raise ValueError(f"fedtrans transforms cells and needs model.name: cellnet, got {name!r}")
        return model

    def _graph(self, config: ModelConfig) -> Graph:
        spec = self.server.input_spec
        channels, size = spec.sample_shape[0], spec.sample_shape[-1]
        return build_graph(cast(CellNetConfig, config), channels, spec.num_classes, size)

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples)  # FedAvg by samples within a model, as FedScale's aggregator

    def init_state(self, params: Params) -> ServerState:
        base = self._base()
        n = self.server.dataset.num_clients
        fs = FedTransState(utilities=np.zeros((n, 1)), similarity=np.ones((1, 1)))
        return ServerState(params=params, models=(base,), algo_state=fs)

    @staticmethod
    def _state(state: ServerState) -> FedTransState:
        if not isinstance(state.algo_state, FedTransState):
            raise TypeError("fedtrans: the server state carries no FedTransState (was it made by init_state?)")
        return state.algo_state

    # ------------------------------------------------------------------------------------------ assignment
    def _flops_per_sample(self, config: ModelConfig) -> float:
        flops = self._flops.get(config)
        if flops is None:
            oracle = self.server.oracle
            if oracle is None:
                raise ValueError("fedtrans: the server context has no cost oracle to price the models with")
            flops = self._flops[config] = float(
                oracle.for_model(config).costs([Assignment()]).train_flops_per_sample[0]
            )
        return flops

    def compatible(self, state: ServerState, view: ClientView) -> np.ndarray:
        """Ids of the models whose training FLOPs for the client's round fit its compute budget (model 0 if none)."""
        per_sample = np.array([self._flops_per_sample(c) for c in as_model_configs(state.models)])
        need = per_sample * samples_per_round(self.train, view.num_examples)
        fits = np.flatnonzero(need <= view.compute_budget)
        return fits if len(fits) else np.zeros(1, dtype=np.int64)

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        utilities = self._state(state).utilities
        out: dict[int, Assignment] = {}
        for view in views:
            rng = derive_rng(self.server.seed, "fedtrans-assign", round_idx, view.client_id)
            model_id = sample_model(utilities[view.client_id], self.compatible(state, view), rng)
            out[view.client_id] = Assignment(model_id=model_id)
        return out

    def client_model(self, state: ServerState, view: ClientView) -> int:
        """``capabilities.ClientModel``: the compatible model of highest utility (the smaller one on ties)."""
        candidates = self.compatible(state, view)
        return int(candidates[int(np.argmax(self._state(state).utilities[view.client_id, candidates]))])

    # ------------------------------------------------------------------------------------------ client side
    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        """The default local training, reporting each cell's ``|mean gradient| / |weight|`` (the weight as received)."""
        model = ctx.model
        if not isinstance(model, CellNet):
            return super().local_train(ctx, x, y)
        weights = {op.name: cast(nn.Parameter, model.layers[op.name].weight) for op in model.graph.cells}
        start = {name: w.detach().clone() for name, w in weights.items()}
        grads = {name: torch.zeros_like(w) for name, w in start.items()}
        hooks = [w.register_hook(_accumulate_into(grads[name])) for name, w in weights.items()]  # type: ignore[no-untyped-call]
        try:
            update = super().local_train(ctx, x, y)
        finally:
            for hook in hooks:
                hook.remove()
        steps = max(update.num_steps, 1)
        metrics = dict(update.metrics)
        for name, w0 in start.items():
            norm = float(torch.linalg.vector_norm(w0))
            metrics[ACTIVENESS_PREFIX + name] = float(torch.linalg.vector_norm(grads[name])) / steps / max(norm, 1e-12)
        return dataclasses.replace(update, metrics=metrics)

    # ------------------------------------------------------------------------------------------ server side
    def server_update(self, state: ServerState, round_idx: int, aggregate: Aggregate) -> ServerState:
        cfg, fs = self.config, self._state(state)
        ok = [o for o in aggregate.outcomes if o.failure is None]
        trained = sorted({o.model_id for o in ok})
        params = self._aggregate(aggregate.params, trained, fs, self._input_scales(state, trained))
        ids = np.array([o.client_id for o in ok], dtype=np.int64)
        utilities = update_utilities(
            fs.utilities,
            ids,
            np.array([o.model_id for o in ok], dtype=np.int64),
            np.array([o.train_loss for o in ok], dtype=np.float64),
            fs.similarity,
        )
        newest = len(state.models) - 1
        mine = [o for o in ok if o.model_id == newest]
        losses = (*fs.losses, _mean_loss(mine)) if mine else fs.losses
        activeness = (*fs.activeness, _mean_activeness(mine))[-cfg.activeness_rounds :] if mine else fs.activeness
        doc = degree_of_convergence(losses, cfg.gamma, cfg.doc_step)
        fs = dataclasses.replace(
            fs,
            utilities=utilities,
            losses=losses,
            activeness=activeness,
            doc=doc,
            trained_rounds=tuple(t + int(k in trained) for k, t in enumerate(fs.trained_rounds)),
        )
        new = ServerState(params, round_idx + 1, state.opt_state, fs, state.models)
        forced = round_idx in cfg.force_rounds
        last_round = round_idx + 1 >= self.server.rounds  # a model made now would never train, yet count as made
        if not (forced or doc <= cfg.beta) or len(state.models) >= cfg.max_models or last_round:
            return new
        if not fs.activeness:  # only a forced round can get here: the DoC needs losses, which come with activeness
            log.warning(
                "fedtrans: no transformation after round %d: model %d has not trained since it was made, so there is "
                "no cell activeness to choose cells by",
                round_idx,
                newest,
            )
            return new
        return self._transform(new, round_idx, forced)

    def _input_scales(self, state: ServerState, trained: Sequence[int]) -> dict[tuple[int, int], dict[str, float]]:
        """``input_scales`` of each pair of ``state``'s models trained this round (none without ``rescale_cropped``)."""
        if not self.config.rescale_cropped:
            return {}
        graphs = {k: self._graph(as_model_config(state.models[k])) for k in trained}
        return {(i, j): input_scales(graphs[i], graphs[j]) for i in trained for j in trained if i != j}

    def _aggregate(
        self,
        params: Params,
        trained: Sequence[int],
        fs: FedTransState,
        scales: Mapping[tuple[int, int], Mapping[str, float]] | None = None,
    ) -> Params:
        """Eq. 5 over the models trained this round (module docstring, step 2); ``scales`` from ``_input_scales``."""
        cfg = self.config
        coefficients: dict[tuple[int, int], float] = {(j, j): 1.0 for j in trained}
        if cfg.soft_aggregation:
            for i in trained:
                for j in trained:
                    if i != j and (i < j or cfg.share_large_to_small):
                        coefficients[(i, j)] = cfg.eta ** fs.trained_rounds[j] * float(fs.similarity[i, j])
        merged = soft_aggregate({k: model_params(params, k) for k in trained}, coefficients, scales)
        replaced = {model_key(j, name): t for j, tensors in merged.items() for name, t in tensors.items()}
        return {key: replaced.get(key, value) for key, value in params.items()}

    def _transform(self, state: ServerState, round_idx: int, forced: bool) -> ServerState:
        """A new model from the newest one (module docstring, step 4)."""
        cfg, ctx, fs = self.config, self.server, self._state(state)
        parent = len(state.models) - 1
        parent_cfg = cast(CellNetConfig, state.models[parent])
        graph = self._graph(parent_cfg)
        # the classifier writes the classes: it cannot be widened, and a layer inserted after it is a classes x
        # classes map; the author code cannot transform it either (widening the last layer fails, deepening a linear
        # layer does nothing), so it is not a candidate unless ``transform_classifier``
        order = [op.name for op in graph.cells if op.dim != CLASSES or cfg.transform_classifier]
        activeness = {name: float(np.mean([dict(r).get(name, 0.0) for r in fs.activeness])) for name in order}
        chosen = select_cells(activeness, cfg.alpha)
        if cfg.layer_selection == "random":
            picked = derive_rng(ctx.seed, "fedtrans-cells", round_idx).choice(len(order), len(chosen), replace=False)
            chosen = [order[i] for i in sorted(picked)]
        steps, widened = self._steps(graph, chosen, fs.widened)
        child = parent + 1
        gen = torch.Generator().manual_seed(derive_seed(ctx.seed, "fedtrans-widen", child))
        tensors = model_params(state.params, parent)
        own = parent_cfg.deepen_width == "own"
        for step in steps:
            graph, tensors = transform_params(graph, tensors, step, cfg.noise, gen, own)
        if not cfg.warmup:
            steps = (*steps, RESET)
        child_cfg = dataclasses.replace(parent_cfg, transforms=(*parent_cfg.transforms, *steps))
        if not cfg.warmup:
            tensors = initial_model_params(child_cfg, ctx.input_spec, ctx.seed, child)
        new = add_model(state, child_cfg, tensors)
        configs = cast(tuple[CellNetConfig, ...], new.models)
        similarity = family_similarity([self._graph(c) for c in configs], [c.transforms for c in configs])
        event = Transformation(round_idx, parent, child, fs.doc, forced, steps)
        log.info(
            "fedtrans: model %d from model %d after round %d (DoC %.5g): %s", child, parent, round_idx, fs.doc, steps
        )
        fs = dataclasses.replace(
            fs,
            utilities=np.concatenate([fs.utilities, fs.utilities[:, parent : parent + 1]], axis=1),
            similarity=similarity,
            losses=(),
            activeness=(),
            widened=widened,
            trained_rounds=(*fs.trained_rounds, 0),
            doc=math.nan,
            log=(*fs.log, event),
        )
        return dataclasses.replace(new, algo_state=fs)

    def _steps(
        self, graph: Graph, chosen: Sequence[str], widened: frozenset[str]
    ) -> tuple[tuple[str, ...], frozenset[str]]:
        """Each chosen cell is widened, unless its own last transformation was a widening (then it is deepened: the
        author code's ``last_scaled_layer``, which keeps a widened cell until it is deepened); a dimension is widened
        once however many of its cells were chosen. Returns the steps and the cells whose last step is a widening."""
        steps: list[str] = []
        dims: set[str] = set()
        after = set(widened)
        for name in chosen:
            op = graph.op(name)
            if name in widened:
                steps.append(deepen_step(name))
                after.discard(name)
            elif op.dim not in dims:
                steps.append(widen_step(name, self.config.widen_factor))
                dims.add(op.dim)
                after.add(name)
        return tuple(steps), frozenset(after)

    def run_summary(self, state: ServerState) -> dict[str, object]:
        """``capabilities.RunSummary``: each model's transformation log and training FLOPs per sample, and every
        transformation."""
        fs = self._state(state)
        return {
            "models": [list(cast(CellNetConfig, c).transforms) for c in state.models],
            "train_flops_per_sample": [self._flops_per_sample(c) for c in as_model_configs(state.models)],
            "transformations": [
                {**dataclasses.asdict(t), "doc": t.doc if math.isfinite(t.doc) else None} for t in fs.log
            ],  # a forced transformation may come before the DoC is known (JSON has no NaN)
        }


def _accumulate_into(total: torch.Tensor) -> Any:
    """A gradient hook adding every gradient of a weight into ``total`` (the sum over local steps)."""

    def hook(grad: torch.Tensor) -> None:
        total.add_(grad)

    return hook


def _mean_loss(outcomes: Sequence[ClientOutcome]) -> float:
    weights = np.array([o.num_examples for o in outcomes], dtype=np.float64)
    return float(np.array([o.train_loss for o in outcomes]) @ weights / weights.sum())


def _mean_activeness(outcomes: Sequence[ClientOutcome]) -> tuple[tuple[str, float], ...]:
    """The clients' cell activeness, weighted by their samples (the aggregate the server sees)."""
    weights = np.array([o.num_examples for o in outcomes], dtype=np.float64)
    names = [k for k in outcomes[0].metrics if k.startswith(ACTIVENESS_PREFIX)]
    values = np.array([[o.metrics.get(k, 0.0) for k in names] for o in outcomes], dtype=np.float64)
    means = weights @ values / weights.sum()
    return tuple((k.removeprefix(ACTIVENESS_PREFIX), float(v)) for k, v in zip(names, means, strict=True))
