"""AnycostFL: Efficient On-Demand Federated Learning over Heterogeneous Edge Devices.

Li, Cheng, Huang, Kang, Yu, Wu, Pan, INFOCOM 2023 (arXiv:2301.03062).

Each client gets the largest rate of ``rates`` whose uniform sub-model fits its budgets and the ``k`` units of every
dimension with the largest L2 norm in the current global model (``TopKNorm`` on ``state.params``): a unit's score is
the squared L2 norm, summed over every weight tensor (two or more axes, classifier excluded) whose output axis writes
it. Count-normalised element-wise mean.

Choices: a residual stream is one dimension, so its channels are scored jointly over every tensor that writes to the
stream and ranked once; the residual adds stay aligned (the Plato port ranks each conv on its own, which breaks identity
blocks; ALGORITHMS.md section 6). Ties keep the lower index. The paper's upload gradient compression and its per-device
optimisation of shrink and compression ratios for latency and energy are not modelled here: the shrink ratio is the
budget-driven rate, and upload compression is the run-wide ``compression`` option.
"""

from __future__ import annotations

from rayfl.config.sections import TrainConfig
from rayfl.fl.common.rates import UniformRateHooks, UniformRates
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.anycostfl.config import AnyCostFLConfig
from rayfl.models.elastic.spec import Selector, TopKNorm

__all__ = ["AnyCostFL"]


class AnyCostFL(UniformRateHooks, SubModelAlgorithm):
    """Largest fitting rate; the units with the largest L2 norm in the global model."""

    name = "anycostfl"
    config: AnyCostFLConfig

    def __init__(self, config: AnyCostFLConfig, train: TrainConfig) -> None:
        super().__init__(config, train, distill=config.distill, distill_space=config.rates)
        self.uniform = UniformRates(self.name, config.rates, config.label_mask)

    def selector(self, round_idx: int, client_id: int) -> Selector:
        return TopKNorm()
