"""FedHeN: Federated Learning in Heterogeneous Networks, and its NoSide and Decouple baselines.

Acar & Saligrama, DyNN workshop at ICML 2022 (paper 001; ALGORITHMS.md section 8).

Two architectures share weights (Assumption 2.1): the *simple* model is an index subset ``M`` of the *complex* one.
Here the complex model is a ResNet with a side exit (``model.side_exit``) and the simple model is the sub-model that
ends at that exit (``ElasticFamily.side_exit_units``: stages 1..k and the side head), built, sent and scattered by
the family like any sub-model.

* **Device types** (Algorithm 1, line 4). A sampled client trains the complex model when it fits its memory and
  bandwidth budgets (the clock's own cost model), else the simple model. The paper's split (the first half of the
  clients simple, the last half complex) is a budget source: ``system.memory`` ``levels`` fixed by client id
  (``id_bounds``), with the simple level below the complex model's need.
* **Client objective** (Algorithm 2). A simple device minimises its loss on the simple model. A complex device
  minimises the complex loss *plus* the side objective, the loss of its embedded simple sub-network on the same batch:
  one forward pass gives both exits' logits (``MultiExit.forward_exits``) and one backward through the sum gives
  ``grad f(w) + grad f([w]_M)`` (line 13). NoSide (Algorithm 4) trains every device on its model's own loss only.
* **Server** (Algorithm 1, lines 17-22). ``[w_c]_M = w_s = (1/|Z|)(sum_simple w_s,i + sum_complex [w_c,j]_M)`` and
  ``[w_c]_M' = (1/|Z_c|) sum_complex [w_c,j]_M'``. This is exactly the count-normalised element-wise mean with every
  client weighing 1 (``MaskedWeightedMean``): the elements of ``M`` are covered by every active device, those of
  ``M'`` by the complex ones only; a round without complex devices leaves ``M'`` as it was.
* **Gradient clipping and failures.** The paper clips gradients at norm 10 (``train.grad_clip_norm: 10``) and drops a
  device whose model turned NaN for that round: the client hosts leave any non-finite update out of the aggregate
  and record it as ``nan_update``.
* **Evaluation.** The engine evaluates the complex model (``test_acc``) and, through ``eval_structures``, the simple
  one (the global simple model is the complex model's ``M`` part, so it is the same parameters at the side-exit
  units), recorded as ``simple`` in ``evals.csv`` (Decouple's own simple model too). ``device_acc`` scores every
  device of the run on the model its budgets give it (``device_evals``). The paper's own reporting models ("Reporting
  Results": the server models averaged over all devices rather than the round's active ones, for reporting only)
  are the engine's all-device model (``eval_all_devices``, ``engine/multieval.py``): this module's aggregation
  applied to every device's last upload, so the simple part is the mean over all devices and the rest the mean over
  all complex devices (Decouple: the means over all simple and over all complex devices). The paper's parenthesis
  ("all complex devices for server complex model and all simple devices for server simple model") could also be
  read as averaging FedHeN's simple model over the simple devices alone; we keep each method's own rule, since what
  the paragraph changes is "all devices" for "only active devices".

NoSide and Decouple are ``FedHeN`` run with their config sections (``NoSideConfig``, ``DecoupleConfig``), under their
own names: the section's type sets the two switches (``side_objective``, ``own_simple_model``).

* **Decouple** (Algorithm 3): two independent FedAvgs in one run, on the engine's several global models
  (``fl/common/multimodel.py``): model 0 is the complex model (the run's), model 1 the simple model as a stand-alone
  architecture (``model.exit_only``: stages 1..k and the side head, the same tensor names as the side-exit
  sub-model). Simple devices train model 1, complex devices model 0 on its own loss; each model is the unweighted mean
  over its own active devices (``1/|Z_s|`` and ``1/|Z_c|``), which the count-normalised element-wise mean gives with
  no per-model code, and a model no device trained keeps its weights.

Choices where the paper is silent: a client whose budgets fit neither model gets the simple one and the clock fails
it (recorded), rather than the method breaking a budget. Decouple's simple model starts from the complex model's
initial ``M`` part (the same start FedHeN's and NoSide's simple models have), so the three methods start alike. The
complex model of Decouple keeps the run's side head tensors (the run's model has a side exit); they get no gradient,
are sent and averaged unchanged, and cost a few kB per transfer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from rayfl.config.model import ModelConfig, ResNetConfig
from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Assignment, ClientView, Params, ServerState
from rayfl.fl.api.algorithm import MAIN_EVAL
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.multimodel import add_model, initial_model_params
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.fedhen.config import DecoupleConfig, FedHeNConfig, NoSideConfig
from rayfl.models.elastic.family import MultiExit
from rayfl.models.elastic.spec import first_k

__all__ = ["FedHeN", "exits_loss"]

SIMPLE = "simple"  # the name the simple model's accuracy is recorded under (evals.csv), for all three methods


def exits_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The sum of the cross-entropy losses of every exit of ``model`` on one batch (one forward pass)."""
    if not isinstance(model, MultiExit):
        raise ValueError(f"the side objective needs a model with early exits, got {type(model).__name__}")
    return torch.stack([nn.functional.cross_entropy(logits, y) for logits in model.forward_exits(x)]).sum()


class FedHeN(SubModelAlgorithm):
    """Simple devices train the side-exit sub-model, complex devices the whole model plus the side objective; with
    ``NoSideConfig`` without the side objective (``noside``), with ``DecoupleConfig`` two global models trained
    apart (``decouple``, module docstring)."""

    name = "fedhen"
    SIMPLE_MODEL: ClassVar[int] = 1  # Decouple's model id of the simple model; the complex model is model 0 (the run's)

    def __init__(self, config: FedHeNConfig | NoSideConfig | DecoupleConfig, train: TrainConfig) -> None:
        super().__init__(config, train)
        self.name = config.name  # fedhen, noside or decouple
        self.side_objective = isinstance(config, FedHeNConfig)  # Algorithm 2's side objective: FedHeN's alone
        self.own_simple_model = isinstance(config, DecoupleConfig)  # Decouple: the simple model is model 1

    def simple_units(self) -> tuple[int, ...]:
        return self.require_family().side_exit_units()

    def complex_units(self) -> tuple[int, ...]:
        return self.require_family().full_units

    def simple_model(self) -> ModelConfig:
        """Decouple's simple model as an architecture of its own: the run's ResNet ending at its side exit."""
        model = self.server.model
        if not isinstance(model, ResNetConfig) or not model.side_exit:
            raise ValueError(f"algorithm {self.name!r} needs a resnet model with a side exit (model.side_exit >= 1)")
        return dataclasses.replace(model, exit_only=True)

    def init_state(self, params: Params) -> ServerState:
        if not self.own_simple_model:
            return super().init_state(params)
        ctx = self.server
        assert ctx.model is not None  # simple_model checked it
        simple = self.simple_model()
        names = initial_model_params(simple, ctx.input_spec, ctx.seed, self.SIMPLE_MODEL)
        start = {name: params[name].detach().clone() for name in names}  # the complex model's initial M part
        state = ServerState(params=dict(params), models=(ctx.model,))
        return add_model(state, simple, start)

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        if not views:
            return {}
        complex_fits = self.fit_mask(np.array([self.complex_units()]), views)[:, 0]
        if self.own_simple_model:
            simple, complex_ = Assignment(model_id=self.SIMPLE_MODEL), Assignment()
        else:
            family = self.require_family()
            simple = family.assignment(first_k(self.simple_units()))
            complex_ = family.assignment(first_k(self.complex_units()))
        return {v.client_id: complex_ if fits else simple for v, fits in zip(views, complex_fits, strict=True)}

    def eval_structures(self, state: ServerState) -> dict[str, tuple[int, ...] | None]:
        """``capabilities.EvalStructures``: the side-exit sub-model, evaluated every round as ``simple`` (none for
        Decouple, whose simple model is a global model of its own, ``model_names``)."""
        return {} if self.own_simple_model else {SIMPLE: self.simple_units()}

    def model_names(self, state: ServerState) -> tuple[str, ...]:
        if self.own_simple_model:
            return (MAIN_EVAL, SIMPLE)  # recorded as FedHeN's and NoSide's simple model is
        return super().model_names(state)

    def device_evals(self, state: ServerState, views: Sequence[ClientView]) -> list[str]:
        """A device uses the complex model (the main evaluation) when it fits its budgets, else the simple one."""
        if not views:
            return []
        complex_fits = self.fit_mask(np.array([self.complex_units()]), views)[:, 0]
        return [MAIN_EVAL if fits else SIMPLE for fits in complex_fits]

    def local_loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        model = ctx.model
        if not self.side_objective:
            return nn.functional.cross_entropy(model(x), y)
        # a simple model has one exit (its side head); a complex one both: its loss plus the side objective
        return exits_loss(model, x, y)
