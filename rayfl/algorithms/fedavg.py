"""FedAvg: Communication-Efficient Learning of Deep Networks from Decentralized Data.

McMahan, Moore, Ramage, Hampson, Agüera y Arcas, AISTATS 2017 (arXiv:1602.05629).

Every client trains the full model; the server averages the updates weighted by sample count. The server step is
written as SGD on the pseudo-gradient ``old - mean`` (Reddi et al., "Adaptive Federated Optimization"), so
``server_lr = 1`` with no momentum is plain averaging and larger or damped steps are a config choice.
"""

from __future__ import annotations

from rayfl.algorithms.base import Algorithm
from rayfl.algorithms.payloads import Aggregate, ServerState
from rayfl.config import FedAvgConfig

__all__ = ["FedAvg"]


class FedAvg(Algorithm):
    """FedAvg with an optional server learning rate and momentum."""

    name = "fedavg"
    config: FedAvgConfig

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples) if self.config.weighting == "samples" else 1.0

    def server_update(self, state: ServerState, round_idx: int, aggregate: Aggregate) -> ServerState:
        cfg = self.config
        if cfg.server_lr == 1.0 and cfg.server_momentum == 0.0:
            return super().server_update(state, round_idx, aggregate)
        new_params = {}
        momentum = dict(state.opt_state)
        for name, old in state.params.items():
            grad = old - aggregate.params[name]  # pseudo-gradient
            if cfg.server_momentum > 0.0:
                buf = momentum.get(name)
                buf = grad.clone() if buf is None else buf.mul(cfg.server_momentum).add_(grad)
                momentum[name] = buf
                grad = buf
            new_params[name] = old - cfg.server_lr * grad
        return ServerState(params=new_params, round_idx=round_idx + 1, opt_state=momentum, algo_state=state.algo_state)
