"""Federated Dropout: Expanding the Reach of Federated Learning by Reducing Client Resource Requirements.

Caldas, Konečný, McMahan, Talwalkar, 2018 (arXiv:1812.07210).

Each client trains a smaller dense model: the largest rate of ``rates`` whose uniform sub-model fits its budgets, with
the kept units of every dimension drawn uniformly at random without replacement. ``per_client``: an independent draw
per client and round (generator ``(seed, "dropout", round, client, dimension)``, FedRolex's ``ResnetServerRandom``);
otherwise one draw per round shared by every client of the round (``(seed, "dropout", round, dimension)``, the core
paper's baseline, which permutes the global channels once per round and then takes the first ``k``). Count-normalised
element-wise mean.

Choices: image input channels and classes are never dropped (the paper keeps input and output layers whole); a residual
stream is one dimension, so the identity blocks' outputs are drawn with the stream and residual adds stay aligned (the
careful ``k1l1/SLT`` version; FedRolex's random mode breaks this, ALGORITHMS.md section 5). Rates rather than a fixed
dropout fraction: the same budget-driven rate choice as the other baselines, so they are compared on equal terms.
"""

from __future__ import annotations

from rayfl.config.sections import TrainConfig
from rayfl.fl.common.rates import UniformRateHooks, UniformRates
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.feddropout.config import FedDropoutConfig
from rayfl.models.elastic.spec import RandomSubset, Selector

__all__ = ["FedDropout"]


class FedDropout(UniformRateHooks, SubModelAlgorithm):
    """Largest fitting rate; units drawn at random per client and round (or per round)."""

    name = "feddropout"
    config: FedDropoutConfig

    def __init__(self, config: FedDropoutConfig, train: TrainConfig) -> None:
        super().__init__(config, train, distill=config.distill, distill_space=config.rates)
        self.uniform = UniformRates(self.name, config.rates, config.label_mask)

    def selector(self, round_idx: int, client_id: int) -> Selector:
        keys = (round_idx, client_id) if self.config.per_client else (round_idx,)
        return RandomSubset(self.server.seed, keys=keys)
