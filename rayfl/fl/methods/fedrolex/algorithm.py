"""FedRolex: Model-Heterogeneous Federated Learning with Rolling Sub-Model Extraction.

Alam, Liu, Yan, Zhang, NeurIPS 2022 (arXiv:2212.01548).

HeteroFL's rate choice (the largest of ``rates`` whose uniform sub-model fits the client's budgets) with a *rolling*
window of units: in round ``r`` a dimension of ``n`` units keeps ``{(n - r + j) mod n : j < k}`` (official
``ResnetServerRoll.split_model``). The window is contiguous modulo ``n``, wraps around, moves by one unit per round
(round 0 keeps the first ``k``), and has the same start for every dimension and every client of a round, so the windows
of different rates are nested. Count-normalised element-wise mean; label masking of the classifier as HeteroFL
(``label_mask``); no static BN (the official code evaluates the global model directly).

**Initial model** (``official_init``): the official code builds its models with HeteroFL's ``init_param`` (norm
weight 1 and bias 0, linear biases 0; ``heterofl.official_init``). **Training set-up**: gradients clipped at norm 1
and the family's plain activation, as HeteroFL (``FedRolexConfig``; ``rates.UniformRates``).

Choice: the official code's ``tmp_counts`` weighting of BN/bias/linear entries (a historical per-element update count
mutated inside its key loop) is not reproduced; every element is averaged with weight 1 per client, as the paper says.
"""

from __future__ import annotations

from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Params, ServerState
from rayfl.fl.common.init import official_init
from rayfl.fl.common.rates import UniformRateHooks, UniformRates, with_clip
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.fedrolex.config import FedRolexConfig
from rayfl.models.elastic.spec import Rolling, Selector

__all__ = ["FedRolex"]


class FedRolex(UniformRateHooks, SubModelAlgorithm):
    """Largest fitting rate; a rolling window whose start moves by one unit per round."""

    name = "fedrolex"
    config: FedRolexConfig

    def __init__(self, config: FedRolexConfig, train: TrainConfig) -> None:
        super().__init__(
            config, with_clip(train, config.grad_clip_norm), distill=config.distill, distill_space=config.rates
        )
        self.uniform = UniformRates(self.name, config.rates, config.label_mask)

    def selector(self, round_idx: int, client_id: int) -> Selector:
        return Rolling(round_idx)

    def init_state(self, params: Params) -> ServerState:
        if not self.config.official_init or self.family is None:
            return ServerState(params=params)
        return ServerState(params=official_init(self.family, params))
