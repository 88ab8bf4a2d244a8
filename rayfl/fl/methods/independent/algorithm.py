"""Independent FedAvg models in one run: the smallest user of the engine's several-global-models capability.

``num_models`` global models of the run's architecture live side by side in the server state
(``fl/common/multimodel.py``); client ``c`` trains model ``c mod num_models`` with plain FedAvg (McMahan et al.,
AISTATS 2017), so each model is the FedAvg of its own client group. The reducer's element-wise mean over the clients
covering each tensor makes this per-model averaging without any per-model code, and a model nobody trained in a round
keeps its weights. FedHeN's "Decouple" baseline (paper 003) is this with one model per device tier.
"""

from __future__ import annotations

from collections.abc import Sequence

from rayfl.core.messages import Assignment, ClientView, Params, ServerState
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.common.multimodel import add_model, initial_model_params
from rayfl.fl.methods.independent.config import IndependentConfig

__all__ = ["IndependentFedAvg"]


class IndependentFedAvg(Algorithm):
    """One FedAvg per client group; the group of client ``c`` is ``c mod num_models``."""

    name = "independent"
    config: IndependentConfig

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples) if self.config.weighting == "samples" else 1.0

    def init_state(self, params: Params) -> ServerState:
        ctx = self.server
        if ctx.model is None:
            raise ValueError("independent: the server context names no model architecture")
        state = ServerState(params=params, models=(ctx.model,))
        for model_id in range(1, self.config.num_models):
            state = add_model(state, ctx.model, initial_model_params(ctx.model, ctx.input_spec, ctx.seed, model_id))
        return state

    def client_model_id(self, state: ServerState, client_id: int) -> int:
        return client_id % len(state.models)

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        return {v.client_id: Assignment(model_id=self.client_model_id(state, v.client_id)) for v in views}
