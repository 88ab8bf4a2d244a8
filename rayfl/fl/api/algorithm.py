"""The contract between the engine and a federated algorithm.

An algorithm fills a few hooks and keeps no state between them; everything it remembers lives in the
``ServerState`` the engine passes in and takes back. Call order, once per round:

1. driver: ``assign(state, round_idx, views)`` → an ``Assignment`` per sampled client;
2. each client host, per client: ``local_train(ctx, x, y)`` on the client's ``ClientContext`` (``fl/api/client.py``:
   its task, model, input spec, generator; the default loop calls ``train_batch``, ``backward_step``, ``local_loss``
   with the same context) → ``ClientUpdate`` weighted by ``client_weight``;
3. hosts and parameter-server shards: the one reduction (below) → ``Aggregate``;
4. driver: the server optimizer (``server.optimizer``, ``fl/common/server_opt.py``: SGD with momentum, Adam, Yogi,
   Adagrad on the pseudo-gradient, shared by every method) turns the aggregate into the new parameters, then
   ``server_update(state, round_idx, aggregate)`` → the next ``ServerState``;
5. driver: the global parameters evaluated as ``eval_units``; with several global models, each under
   ``model_names``, and each device on the evaluation ``device_evals`` names.

Before the first round the engine binds the algorithm to the run: ``bind_server(ServerContext)`` on the driver (the
model's elastic family, the cost model the clock uses, the data set, the seed), and ``bind_client(family, spec)`` on
every client host. Server context never travels to the hosts (``__getstate__`` drops it). After each round's server
update the driver reads ``round_stats()`` into the round's record.

Hooks that only one method needs are not here: they are capability protocols (``rayfl/fl/api/capabilities.py``:
model search's stateful assignment, FedorAS's FLOP counts and phases, HeteroFL's static-BN evaluation, FedHeN's
extra structures, FedTrans's budget-aware client model and run summary) that the engine checks with ``isinstance``,
doing what every other method does otherwise.

**One reduction, not a hook.** Every method aggregates with the count-weighted element-wise mean
(``rayfl/core/reducers.py``: ``MaskedWeightedMean``; elements no client covered keep their value). It is fixed because
the engine splits it across processes: client hosts accumulate float64 partial sums next to training (torch), and
parameter-server shards merge them in host order and divide with a numpy twin of the same arithmetic
(``rayfl/core/partials.py``: ``ArrayWeightedMean``, so shards never load torch), which makes results bit for bit
independent of how clients are spread over hosts and shards. A method shapes aggregation through the weights, per
client (``client_weight``) or per tensor (``ClientUpdate.tensor_weights``: FedorAS's OPA), and through
``server_update`` (distillation, model transformations), never by replacing the reduction; the server optimizer on
the aggregate is one shared piece for every method (``server_optimizer``).

Client-side hooks run inside Ray actors or in-process alike, so they must be pure functions of their arguments and
draw randomness only from the task's derived generators. One algorithm object serves every client a host trains, so a
client hook keeps nothing on ``self``: what a method computes in ``local_train`` for its batch hooks goes into the
client's context (``ClientContext.put``/``get``). Algorithms never import Ray.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

import numpy as np
import torch
from torch import nn

from rayfl.config.model import ModelConfig
from rayfl.config.sections import ServerOptimizerConfig, TrainConfig
from rayfl.core.messages import Aggregate, Assignment, ClientUpdate, ClientView, Params, ServerState
from rayfl.core.reducers import MaskedWeightedMean
from rayfl.fl.api.capabilities import client_models
from rayfl.fl.api.client import ClientContext
from rayfl.fl.api.optim import ClientOptimizer, client_optimizer
from rayfl.models.inputs import InputSpec, module_device, to_input

if TYPE_CHECKING:
    from rayfl.data.federated import FederatedDataset
    from rayfl.models.elastic import CostModel, ElasticFamily
    from rayfl.system.costs import CostOracle

__all__ = ["MAIN_EVAL", "Algorithm", "RoundStats", "ServerContext", "round_lr"]

# The name of the engine's main evaluation (the evaluated parameters as ``eval_units``: ``test_acc``) among the
# evaluation names a device's model can have (``Algorithm.device_evals``); structure and model names must differ
# from it.
MAIN_EVAL = "main"


@dataclass(frozen=True)
class ServerContext:
    """What the server side of an algorithm may use besides its config: the run's seed and sizes, the model's
    elastic family (``None`` for fixed models), the cost model whose peak memory is exactly the need the clock checks
    (runtime overhead included; ``None`` for fixed models), and the federated data set (labels per client; the
    training pool for HeteroFL's static BN)."""

    seed: int
    rounds: int
    clients_per_round: int
    input_spec: InputSpec
    family: ElasticFamily | None
    cost: CostModel | None
    dataset: FederatedDataset
    model: ModelConfig | None = None  # the run's architecture (model 0 of a multi-model run)
    # the clock's costs of any architecture under the run's training set-up (``for_model``): what a method that
    # creates models (FedTrans) prices them with, exactly as the clock will
    oracle: CostOracle | None = None
    eval_widths: tuple[float, ...] = ()  # the x p sub-models the engine evaluates (``eval_widths``), named ``x{p:g}``
    # the compute speeds (FLOP/s; inf when unconstrained) of the given clients at the first round's check-in, looked
    # up when asked (FedorAS's tiers by compute ask for every client; no other method asks, so binding a run of a
    # million clients reads none); None when the engine did not provide it
    compute_flops_per_s_of: Callable[[np.ndarray], np.ndarray] | None = None


@dataclass(frozen=True)
class RoundStats:
    """An algorithm's own numbers for a round (NaN where it has none): server seconds spent searching and in
    server-side training (distillation, static BN), distinct structures assigned so far, and the search's hit rate."""

    search_s: float = math.nan
    distinct_structures: float = math.nan
    hit_rate: float = math.nan
    server_train_s: float = math.nan


def round_lr(train: TrainConfig, round_idx: int, num_rounds: int) -> float:
    """The client learning rate for a round (a server-side schedule over rounds, as HeteroFL steps its LR)."""
    if train.lr_schedule == "cosine":
        return train.lr * 0.5 * (1.0 + math.cos(math.pi * round_idx / max(1, num_rounds)))
    if train.lr_schedule == "step":
        passed = sum(1 for r in train.lr_decay_rounds if round_idx >= r)
        return train.lr * train.lr_decay**passed
    return train.lr


class Algorithm:
    """Base class with FedAvg behaviour in every hook; subclasses override the hooks their paper changes."""

    # the method's registry name (``algorithm.name``); a class that serves several names (FedResCuE's ablations,
    # FedHeN's baselines) sets its instance's from its config
    name: str = "base"
    # True: the engine keeps a state per client across rounds (``engine/exec/client_state.py``), handed to
    # ``local_train`` as ``ctx.memory`` (``task.client_state``) and replaced by the ``ClientUpdate.client_state`` it
    # returns
    keeps_client_state: ClassVar[bool] = False

    # the one reduction every method aggregates with (module docstring: why it is not a hook); ``Final``, so that
    # mypy refuses a subclass that tries to replace it
    reducer: Final = MaskedWeightedMean()

    def __init__(self, config: Any, train: TrainConfig) -> None:
        self.config = config
        self.train = train
        self.family: ElasticFamily | None = None
        self.input_spec: InputSpec | None = None
        self._server: ServerContext | None = None

    # ------------------------------------------------------------------------------------------ binding
    def bind_server(self, ctx: ServerContext) -> None:
        """Called once on the driver before round 0; subclasses that need more set-up extend it."""
        self._server = ctx
        self.bind_client(ctx.family, ctx.input_spec)

    def bind_client(self, family: ElasticFamily | None, input_spec: InputSpec) -> None:
        """Called once on every client host (and by ``bind_server``)."""
        self.family = family
        self.input_spec = input_spec

    @property
    def server(self) -> ServerContext:
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__}: server-side hook called before bind_server")
        return self._server

    def needs_family(self) -> bool:
        """Whether this method, as configured, cuts sub-models out of an elastic family (so a fixed model, such as
        ``model.name: custom``, cannot serve it); checked before a run starts (``engine/preflight.py``)."""
        return False

    def family_problems(self, family: ElasticFamily) -> list[tuple[tuple[str, ...], str]]:
        """What of this method's config the model ``family`` cannot serve, as (key path inside the method's section,
        reason) pairs, e.g. a named smallest model with more stages than the network has. ``rayfl validate`` and
        ``run`` ask it before anything starts (``engine/preflight.py::check_family_fits``, the key prefixed with the
        section's path), ``bind_server`` again on the real family; none by default."""
        return []

    def require_family(self) -> ElasticFamily:
        if self.family is None:
            raise ValueError(
                f"algorithm {self.name!r} assigns sub-models, so the model needs an elastic family: use one of the "
                "built-in families, or for your own architecture write an ElasticFamily (docs/models.md: 'Your own "
                "model with sub-model methods'); model.name: custom is a fixed model for full-model methods such as "
                "fedavg"
            )
        return self.family

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_server"] = None  # driver-only: the cost model and the data set stay on the driver
        return state

    def round_stats(self) -> RoundStats:
        """The algorithm's numbers for the round just finished (read after ``server_update``)."""
        return RoundStats()

    # ------------------------------------------------------------------------------------------ server side
    def init_state(self, params: Params) -> ServerState:
        """The state before round 0, from freshly initialised global parameters."""
        return ServerState(params=params)

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        """Which (sub-)model each sampled client trains; the default gives everyone the full model."""
        return {v.client_id: Assignment() for v in views}

    def client_weight(self, num_examples: int) -> float:
        """A client's weight in the reducer's mean."""
        return float(num_examples)

    def server_optimizer(self, configured: ServerOptimizerConfig) -> ServerOptimizerConfig:
        """The server optimizer this method's rounds run with (``rayfl/fl/common/server_opt.py``, before
        ``server_update``): the run's ``server.optimizer`` (``configured``); FedAvg reads its own ``server_lr`` and
        ``server_momentum`` as ``sgd`` (the keys it had before the optimizer was shared)."""
        return configured

    def server_update(self, state: ServerState, round_idx: int, aggregate: Aggregate) -> ServerState:
        """The next global state from the round's aggregate, after the server optimizer (``server.optimizer``) has
        made its parameters the new model's; the default adopts them."""
        return ServerState(
            params=aggregate.params,
            round_idx=round_idx + 1,
            opt_state=state.opt_state,
            algo_state=state.algo_state,
            models=state.models,
        )

    def eval_units(self, state: ServerState) -> tuple[int, ...] | None:
        """The structure the engine evaluates the global parameters (``capabilities.eval_params``) as: ``None`` (the
        default) is the full model; unit counts mean the first-k sub-model of the family with those units (FedAvg on
        the smallest model)."""
        return None

    def client_model_id(self, state: ServerState, client_id: int) -> int:
        """Which global model client ``client_id`` would be assigned now: the engine scores the client's test data on
        it for the average client accuracy (paper 002). The default is model 0 (single-model methods); a method whose
        choice depends on the client's budgets implements ``capabilities.ClientModel`` instead (FedTrans)."""
        return 0

    def model_names(self, state: ServerState) -> tuple[str, ...]:
        """A name for every global model in id order (one for a single-model run). Model 0's evaluation is the main one
        (``MAIN_EVAL``, ``test_acc``); each further model's accuracy is also recorded under its name in ``evals.csv``
        every evaluated round. The default is ``model{k}`` (Decouple: its simple model is ``simple``)."""
        return (MAIN_EVAL, *(f"model{k}" for k in range(1, max(1, len(state.models)))))

    def device_evals(self, state: ServerState, views: Sequence[ClientView]) -> list[str]:
        """For every device (one view per client of the run, its budgets at the evaluated round's end), the name of
        the evaluation that scores the model it uses: ``MAIN_EVAL``, a name of ``capabilities.eval_structures`` or of
        ``model_names``. The engine records the mean over devices of those accuracies (``device_acc``: each model
        weighted by how many devices use it, paper 001's average over devices' models). The default is the model
        ``capabilities.client_model`` names (the main evaluation in a single-model run)."""
        names = self.model_names(state)
        return [names[k] for k in client_models(self, state, views)]

    # ------------------------------------------------------------------------------------------ client side
    def local_loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The client objective of ``ctx.model`` on one batch; the default is cross-entropy."""
        model = ctx.model
        if self.train.sequence_loss == "all":
            # every prefix of a window predicts its next character; the last target is the window's label
            targets = torch.cat([x[:, 1:], y[:, None]], dim=1)
            logits = model(x, all_positions=True)
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return nn.functional.cross_entropy(model(x), y)

    def make_optimizer(self, params: Sequence[nn.Parameter], lr: float) -> ClientOptimizer:
        """A fresh optimizer per client and round (clients keep no optimizer state, as in HeteroFL and FedAvg):
        torch.optim's SGD or Adam, computed without importing torch._dynamo (``rayfl/fl/api/optim.py``)."""
        cfg = self.train
        return client_optimizer(
            cfg.optimizer, params, lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov
        )

    def backward_step(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One batch of ``local_train``: compute the loss, back-propagate it and return it (for the reported mean).
        The default is ``local_loss``; methods with several passes per batch (FjORD) override this."""
        loss = self.local_loss(ctx, x, y)
        loss.backward()  # type: ignore[no-untyped-call]  # torch stubs leave backward untyped
        return loss

    def train_batch(
        self,
        ctx: ClientContext,
        x: torch.Tensor,
        y: torch.Tensor,
        optimizer: ClientOptimizer,
        params: Sequence[nn.Parameter],
        batch_idx: int,
    ) -> torch.Tensor:
        """Everything ``local_train`` does with one batch, returning the loss it reports: by default one step of
        ``optimizer`` on ``backward_step``'s gradients (clipped to ``grad_clip_norm``). Methods that take several
        steps per batch, update only part of the model in a step (FedResCuE), or draw something per batch (FedorAS's
        path, keyed on ``batch_idx``: the client's batches this round counted from 0 over all epochs, see
        ``batch_sizes``) override this."""
        optimizer.zero_grad(set_to_none=True)
        loss = self.backward_step(ctx, x, y)
        if self.train.grad_clip_norm > 0:
            nn.utils.clip_grad_norm_(params, self.train.grad_clip_norm)
        optimizer.step()
        return loss

    def batch_sizes(self, num_examples: int) -> list[int]:
        """The size of every batch ``local_train`` trains a client of ``num_examples`` examples on, in order: ``epochs``
        passes over the data in batches of ``batch_size`` (the last one of a pass smaller), stopped after
        ``max_steps`` batches. A method can thus replay what each batch did from the task alone (FedorAS's counts)."""
        cfg = self.train
        one_pass = [min(cfg.batch_size, num_examples - lo) for lo in range(0, num_examples, cfg.batch_size)]
        sizes = one_pass * cfg.epochs
        return sizes[: cfg.max_steps] if cfg.max_steps else sizes

    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        """Train ``ctx.model`` (already loaded with the client's weights) on one client's data.

        Batches are drawn by a permutation from ``ctx.generator`` (``derive_torch_generator(seed, "train", round,
        client)``), so a client's training is the same wherever and whenever it runs. Data goes to the model's device;
        the permutation stays on the CPU (the generator's), so the batches are the same on every device. A method that
        needs something of its own in its batch hooks computes it here and ``ctx.put``s it before calling this.
        """
        cfg = self.train
        model, task, gen = ctx.model, ctx.task, ctx.generator
        device = module_device(model)
        inputs = to_input(x, ctx.input_spec, device)
        labels = torch.from_numpy(np.asarray(y, dtype=np.int64)).to(device)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = self.make_optimizer(params, task.lr)
        model.train()
        n = len(labels)
        sizes = self.batch_sizes(n)
        per_epoch = -(-n // cfg.batch_size)
        loss_sum = 0.0
        order = torch.zeros(0, dtype=torch.long)
        for batch_idx, size in enumerate(sizes):
            start = (batch_idx % per_epoch) * cfg.batch_size
            if start == 0:  # a new epoch: a fresh permutation of the client's examples
                order = torch.randperm(n, generator=gen)
            idx = order[start : start + size].to(device)
            bx, by = inputs[idx], labels[idx]
            loss = self.train_batch(ctx, bx, by, opt, params, batch_idx)
            for _ in range(cfg.steps_per_batch - 1):  # the equal-updates control: the same batch again
                self.train_batch(ctx, bx, by, opt, params, batch_idx)
            loss_sum += float(loss.detach())
        steps = len(sizes)
        values = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
        return ClientUpdate(
            client_id=task.client_id,
            weight=self.client_weight(n),
            values=values,
            slices=dict(task.assignment.slices),
            num_examples=n,
            train_loss=loss_sum / steps if steps else float("nan"),
            num_steps=steps,
        )
