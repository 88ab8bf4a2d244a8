"""Capabilities: hooks that one method needs live outside the core contract, and the engine's defaults apply to every
method that does not have them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rayfl.core.messages import Assignment, ClientView, ServerState
from rayfl.fl.api import capabilities
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.methods.fedavg.algorithm import FedAvg
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedhen.algorithm import FedHeN
from rayfl.fl.methods.fedoras.algorithm import FedorAS
from rayfl.fl.methods.fedoras.search import FedorASSearch
from rayfl.fl.methods.fedtrans.algorithm import FedTrans
from rayfl.fl.methods.heterofl.algorithm import HeteroFL
from rayfl.fl.methods.model_search.algorithm import ModelSearchAlgorithm
from tests.helpers import tiny_config

TRAIN = tiny_config().train
ONE_METHOD_HOOKS = {
    "assign_with_state": (capabilities.StatefulAssign, ModelSearchAlgorithm),
    "train_flops": (capabilities.CountsTrainFlops, FedorAS),
    "server_round": (capabilities.ServerPhase, FedorASSearch),
    "eval_params": (capabilities.EvalParams, HeteroFL),
    "eval_model": (capabilities.EvalModel, HeteroFL),
    "eval_structures": (capabilities.EvalStructures, FedHeN),
    "client_model": (capabilities.ClientModel, FedTrans),
    "run_summary": (capabilities.RunSummary, FedTrans),
}


def test_one_method_hooks_are_capabilities_of_their_method_not_of_the_contract() -> None:
    for hook, (protocol, method) in ONE_METHOD_HOOKS.items():
        assert not hasattr(Algorithm, hook), hook
        assert hasattr(method, hook) and issubclass(method, protocol), hook
        assert not issubclass(FedAvg, protocol), hook


def test_defaults_are_what_every_other_method_does() -> None:
    algorithm = FedAvg(FedAvgConfig(), TRAIN)
    state = ServerState(params={}, round_idx=3)
    views = [ClientView(2, 10), ClientView(5, 7)]
    assignments, after = capabilities.assign_with_state(algorithm, state, 3, views)
    assert assignments == {2: Assignment(), 5: Assignment()} and after is state
    assert capabilities.train_flops(algorithm, 3, views, assignments) is None
    assert capabilities.eval_params(algorithm, state) is state.params
    assert capabilities.eval_model(algorithm) is None
    assert capabilities.eval_structures(algorithm, state) == {}
    assert capabilities.client_model(algorithm, state, views[0]) == 0
    assert capabilities.run_summary(algorithm, state) == {}
    assert capabilities.for_round(algorithm, 7) is algorithm


def test_a_capability_is_used_where_a_method_has_it() -> None:
    class Counting(FedAvg):
        def train_flops(
            self, round_idx: int, views: Sequence[ClientView], assignments: Mapping[int, Assignment]
        ) -> np.ndarray | None:
            return np.full(len(views), float(round_idx))

    flops = capabilities.train_flops(Counting(FedAvgConfig(), TRAIN), 4, [ClientView(0, 1)], {0: Assignment()})
    assert flops is not None and flops.tolist() == [4.0]
