"""FedorAS, phase 3: per-tier fine-tuning of each tier's model, all tiers in one run, and the paper's baselines.

Paper 003 Sec. 3.3 and the official ``src/finetune.py`` (``finetune_model_in_cluster``; ALGORITHMS.md section 10).
The phase takes over the search's state (or supernet training's, or none) and trains one stand-alone model per tier
with plain FedAvg (McMahan et al. 2017), on the engine's several global models (``fl/common/multimodel.py``):

* **Models.** Tier ``t``'s path is realised as ``model.path`` (``SupernetConfig.path``: only that path's ops, with the
  supernet's tensor names), model ``t`` of the run (model 0 under its own names, ``t > 0`` under ``m{t}/``);
  ``ServerState.models`` holds the architectures. ``architectures: searched`` takes each tier's best path from the
  search phase (``SearchState``), ``random`` one valid path per tier drawn inside its FLOPs bracket from
  ``derive_rng(seed, "fedoras-random-architecture", tier)`` (the paper's tier-aware FedAvg baseline; ``draw`` d > 0
  adds d to the keys: App. E's random search trains several draws), ``given`` the
  configured ``paths``. ``init: supernet`` copies the supernet's tensors by name (FedorAS); ``init: random`` draws
  fresh weights (``initial_model_params``: the paper's rand-init baseline, same architectures, random init).
* **Eligibility.** Tier ``t``'s model trains on clients of tier ``t`` and every higher tier (Sec. 3.3), never on a
  lower tier's.
* **One cohort, several FedAvgs.** The official code fine-tunes each tier in its own FL run with its own sampled
  clients; rayfl samples one cohort per round, so the phase splits it over the models (``split_cohort``): models are
  served from the highest tier (fewest eligible clients) down, each taking its equal share of the clients still
  unassigned (rounded up), drawn uniformly among those eligible for it; tier 0's model takes whoever is left. Each
  model so gets about ``clients_per_round / tiers`` clients a round (the paper's 6 per tier per round is
  ``clients_per_round: 24`` with 4 tiers); with at least one client per model in the cohort every quota is at least
  one, and a model goes without only when no client eligible for it is left (too few of its tier and above were
  sampled). The draw is ``derive_rng(seed, "fedoras-finetune", round)``.
* **Evaluation and records.** Every model is scored on the whole test set each evaluated round: tier 0's model is the
  engine's main evaluation (``test_acc``: the realised path evaluated as the supernet's sub-model, ``eval_units``),
  tier ``t``'s is recorded as ``tier{t}`` in ``evals.csv`` and all of them in ``model_accs``; every client is scored on
  its own tier's model (``client_acc``, ``device_acc``). ``phase_result`` reports per tier the path, its FLOPs and
  parameters, the eligible clients and the final test accuracy.

State: the tiers, the paths and the initialisation live in ``FinetuneState`` (``ServerState.algo_state``), the models'
weights in ``params`` and their architectures in ``models``, so a checkpoint of the state covers the whole phase.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rayfl.config.model import SupernetConfig
from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Assignment, ClientView, Params, ServerState
from rayfl.core.rng import derive_rng
from rayfl.fl.api.algorithm import MAIN_EVAL, Algorithm, ServerContext
from rayfl.fl.common.multimodel import initial_model_params, model_key, model_params
from rayfl.fl.methods.fedoras.algorithm import FedorASState, TierPlan, context_tables, supernet_family, tier_plan
from rayfl.fl.methods.fedoras.config import FedorASFinetuneConfig
from rayfl.fl.methods.fedoras.sampling import OpTables, path_flops, sample_paths_in_bracket
from rayfl.fl.methods.fedoras.search import SearchState, evaluate_paths

__all__ = ["FedorASFinetune", "FinetuneState", "split_cohort"]


@dataclass(frozen=True)
class FinetuneState:
    """The fine-tuning phase's state: the tiers and each tier's path (op indices), as the models were built."""

    tiers: TierPlan
    paths: tuple[tuple[int, ...], ...]
    init: str


def split_cohort(client_tiers: np.ndarray, num_models: int, rng: np.random.Generator) -> np.ndarray:
    """The model each client of a cohort trains (module docstring): models from the highest down, each taking
    ``ceil(left / models left)`` of the unassigned clients eligible for it (tier >= the model's), in a random order."""
    tiers = np.asarray(client_tiers, dtype=np.int64)
    model = np.full(len(tiers), -1, dtype=np.int64)
    order = rng.permutation(len(tiers))
    left = len(tiers)
    for t in range(num_models - 1, -1, -1):
        quota = -(-left // (t + 1))
        eligible = order[(model[order] < 0) & (tiers[order] >= t)]
        model[eligible[:quota]] = t
        left -= len(eligible[:quota])
    return model


class FedorASFinetune(Algorithm):
    """One FedAvg per tier, tier ``t``'s model on tiers ``>= t`` (module docstring)."""

    name = "fedoras_finetune"
    config: FedorASFinetuneConfig

    def __init__(self, config: FedorASFinetuneConfig, train: TrainConfig) -> None:
        super().__init__(config, train)
        self._tables: OpTables | None = None
        self._own_tiers: TierPlan | None = None  # a run that starts with this phase computes its tiers

    def bind_server(self, ctx: ServerContext) -> None:
        super().bind_server(ctx)
        self._tables = context_tables(ctx, "fedoras_finetune")
        if self.config.tiers is not None:
            self._own_tiers = tier_plan(self.config.tiers, self._tables, ctx)

    @property
    def tables(self) -> OpTables:
        if self._tables is None:
            raise RuntimeError("fedoras_finetune: bind_server must run first")
        return self._tables

    # ------------------------------------------------------------------------------------------ phase hooks
    def init_state(self, params: Params) -> ServerState:
        """The run's first phase: the configured tiers, random or given paths, fresh weights."""
        if self._own_tiers is None:
            raise ValueError("fedoras_finetune as a run's first phase needs its own tiers (algorithm.tiers)")
        return self.tier_models(params, self._own_tiers, None, round_idx=0)

    def enter_phase(self, previous: ServerState, round_idx: int) -> ServerState:
        """After supernet training or the search: their tiers, the searched (or random, or given) paths, weights
        copied from the supernet or drawn afresh."""
        inherited = previous.algo_state
        if not isinstance(inherited, FedorASState | SearchState):
            raise ValueError("fedoras_finetune must follow a fedoras or fedoras_search phase, or start the run")
        if self._own_tiers is not None:
            raise ValueError("fedoras_finetune after a FedorAS phase inherits its tiers: leave algorithm.tiers unset")
        searched = inherited.best_paths() if isinstance(inherited, SearchState) and inherited.searches else None
        return self.tier_models(previous.params, inherited.tiers, searched, round_idx)

    def tier_models(
        self, supernet: Params, tiers: TierPlan, searched: list[np.ndarray] | None, round_idx: int
    ) -> ServerState:
        """The state holding one model per tier: its architecture in ``models``, its weights in ``params``."""
        paths = self.tier_paths(tiers, searched)
        ctx, family = self.server, supernet_family(self.family)
        if not isinstance(ctx.model, SupernetConfig):
            raise ValueError("fedoras_finetune needs model.name: supernet")
        configs = tuple(dataclasses.replace(ctx.model, path=family.path_names(p)) for p in paths)
        params: Params = {}
        for tier, (config, path) in enumerate(zip(configs, paths, strict=True)):
            if self.config.init == "random":
                weights = initial_model_params(config, ctx.input_spec, ctx.seed, tier)
            else:  # the path's tensors of the supernet, by name (the realised model names them alike)
                units, space = family.units_of_path(path), family.space
                weights = {n: supernet[n].detach().clone() for n in space.layouts if space.present(n, units)}
            params.update({model_key(tier, n): v for n, v in weights.items()})
        state = FinetuneState(tiers, tuple(tuple(int(o) for o in p) for p in paths), self.config.init)
        return ServerState(params=params, round_idx=round_idx, algo_state=state, models=configs)

    def tier_paths(self, tiers: TierPlan, searched: list[np.ndarray] | None) -> list[np.ndarray]:
        """Each tier's path: the search's best, a random one inside the tier's bracket, or the configured one."""
        family, how = supernet_family(self.family), self.config.architectures
        if how == "searched":
            if searched is None:
                raise ValueError("fedoras_finetune: architectures 'searched' must follow a fedoras_search phase")
            paths = [np.asarray(p, dtype=np.int64) for p in searched]
        elif how == "random":
            paths = []
            for tier in range(tiers.num_tiers):
                draw = (self.config.draw,) if self.config.draw else ()  # draw 0: the keys it always had
                rng = derive_rng(self.server.seed, "fedoras-random-architecture", tier, *draw)
                lo, hi = tiers.edges[tier], tiers.edges[tier + 1]
                paths.append(sample_paths_in_bracket(self.tables, 1, lo, hi, rng)[0])
        else:
            paths = [np.array([family.op_names.index(op) for op in names]) for names in self.config.paths]
        if len(paths) != tiers.num_tiers:
            raise ValueError(f"fedoras_finetune: {len(paths)} paths for {tiers.num_tiers} tiers")
        return paths

    # ------------------------------------------------------------------------------------------ rounds
    def _state(self, state: ServerState) -> FinetuneState:
        if not isinstance(state.algo_state, FinetuneState):
            raise ValueError("fedoras_finetune: the state holds no tier models")
        return state.algo_state

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        tiers = self._state(state).tiers
        clients = [v.client_id for v in views]
        models = split_cohort(
            tiers.client_tier[clients], tiers.num_tiers, derive_rng(self.server.seed, "fedoras-finetune", round_idx)
        )
        return {c: Assignment(model_id=int(m)) for c, m in zip(clients, models, strict=True)}

    def client_model_id(self, state: ServerState, client_id: int) -> int:
        """A client uses its own tier's model (the largest it may run)."""
        return int(self._state(state).tiers.client_tier[client_id])

    def model_names(self, state: ServerState) -> tuple[str, ...]:
        return (MAIN_EVAL, *(f"tier{t}" for t in range(1, len(state.models))))

    def eval_units(self, state: ServerState) -> tuple[int, ...] | None:
        """Tier 0's model as the supernet's sub-model with its path (the run's model is the supernet)."""
        return supernet_family(self.family).units_of_path(self._state(state).paths[0])

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples)

    def phase_result(self, state: ServerState) -> dict[str, object]:
        """Per tier: the path (op names), its FLOPs and parameters, the tier's clients and those eligible for its
        model, and the model's test accuracy at the phase's end (the engine's batches: ``train.eval_batch_size``)."""
        finetune = self._state(state)
        family, tables, ctx = supernet_family(self.family), self.tables, self.server
        arrays = {k: v.detach().cpu().numpy() for k, v in state.params.items()}
        tiers = finetune.tiers
        out: list[dict[str, object]] = []
        for tier, path in enumerate(finetune.paths):
            weights = {k: arrays[model_key(tier, k)] for k in model_params(state.params, tier)}
            test = evaluate_paths(
                family,
                weights,
                ctx.dataset.x_test,
                ctx.dataset.y_test,
                ctx.input_spec,
                self.train.eval_batch_size,
                np.array([path]),
            )
            out.append(
                {
                    "tier": tier,
                    "flops_bracket": [float(tiers.edges[tier]), float(tiers.edges[tier + 1])],
                    "clients": int((tiers.client_tier == tier).sum()),
                    "eligible_clients": int((tiers.client_tier >= tier).sum()),
                    "path": list(family.path_names(path)),
                    "flops": float(path_flops(tables, np.array(path))[0]),
                    "params": float(tables.fixed_params + tables.params[np.arange(len(path)), path].sum()),
                    "test_acc": float(test[0]),
                }
            )
        return {"architectures": self.config.architectures, "init": finetune.init, "tiers": out}
