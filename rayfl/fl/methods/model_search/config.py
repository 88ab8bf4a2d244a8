"""The configuration section of the core method, dynamic model search with in-place distillation (paper 000). Imports
neither torch nor Ray: the registry and ``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfl.config.fields import bounded, width_ratios
from rayfl.fl.common.distill.config import DistillConfig

__all__ = ["EXPLORE_PROBABILITY_DEFAULT", "ModelSearchConfig", "SmallestConfig"]

# Without ``explore_probability`` or ``epsilon``: 0.2, what the old default ``epsilon: 0.8`` meant (Algorithm 2's
# reading), so a config that sets neither keeps its records.
EXPLORE_PROBABILITY_DEFAULT = 0.2


@dataclass(frozen=True, kw_only=True)
class SmallestConfig:
    """The search's smallest structure as a named model (the pool starts with it and the largest; a client that
    fits nothing in the pool gets the space's own smallest structure when that fits, else this one, failing): every
    searchable width at ``ratio`` and, per stage, only the first ``blocks[s]`` blocks (the others removed).
    ResNets have four stages (ResNet18 inside ResNet34/152: ``[2, 2, 2, 2]``), the ViT and the character BERT one
    (ViT-tiny-tiny, "ViT-tiny with only one depth": ``[1]``); ``[]`` keeps every block. Paper 000, Table 2's
    "smallest client model"."""

    # the width ratio of every kept searchable dimension (0 < ratio <= 1)
    ratio: float = bounded(1.0, gt=0.0, le=1.0)
    # blocks kept per stage, the first ones of each stage; [] keeps every block
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ModelSearchConfig:
    """Dynamic model search with federated in-place distillation (paper 000): each client the structure with the
    largest ``criterion`` that fits its memory and bandwidth, found in a sampling pool grown by constrained random
    search (``explore_probability`` / ``t_max``) over per-layer ratios ``ratios`` (S; 0 removes a skippable block);
    count-normalised element-wise mean; in-place distillation on Gaussian inputs after aggregation (``distill``).

    **The paper's epsilon has two readings.** Algorithm 2 (line 9: "while a uniform draw is bigger than epsilon,
    random search") and Sec. 3.2 ("we adopt the searched structure with a probability of epsilon") make epsilon the
    probability of *stopping*: the paper's epsilon = 0.8 explores with probability 0.2 per test
    (``explore_probability: 0.2``). Appendix E.1 and Figure 10 ("larger epsilon can help get better utilization", with
    utilisation rising as epsilon grows) hold only when epsilon is the probability of *exploring*:
    ``explore_probability: 0.8``. ``explore_probability`` names the quantity without the ambiguity: each test draws
    another structure with this probability, up to ``t_max`` draws. The paper settings use 0.8 (Figure 10's reading).
    ``epsilon`` is a deprecated alias kept so old configs load with their old meaning (Algorithm 2's):
    ``epsilon: e`` is ``explore_probability: 1 - e``; setting both is an error."""

    name: Literal["model_search"] = "model_search"
    ratios: tuple[float, ...] = width_ratios((0.0, 0.5, 1.0), zero_ok=True)
    # probability that each test of the search draws another structure (at most t_max draws per client); null = 0.2
    # (or 1 - epsilon when the deprecated epsilon is set). Paper's epsilon 0.8: 0.2 by Algorithm 2 / Sec. 3.2 (epsilon
    # = probability of adopting the pool's pick), 0.8 by App. E.1 / Fig. 10 (epsilon = probability of exploring)
    explore_probability: float | None = bounded(None, ge=0.0, le=1.0)
    # deprecated: Algorithm 2's stop threshold (explore while a uniform draw > epsilon), i.e. explore_probability =
    # 1 - epsilon; null = unset
    epsilon: float | None = bounded(None, ge=0.0, le=1.0)
    t_max: int = bounded(5, ge=0)
    criterion: Literal["params", "memory", "bytes"] = "params"
    admit: Literal["all", "fitting"] = "all"
    # what one ratio of S covers: 'layer' = one of the paper's layers (a transformer block's heads and MLP share one
    # ratio, 0 removes the whole block: Definition 3.1's "each search option defines the output dimension of the
    # layers", with "layers" of a ViT/BERT counted in blocks, Sec. 4.1.1); 'dimension' = every searchable dimension on
    # its own (a block's heads and MLP width separately, a finer space). Same for ResNets (their dimensions are layers)
    granularity: Literal["dimension", "layer"] = "dimension"
    # the smallest structure (pool seed and fallback): null = every dimension at its smallest allowed ratio (0 for
    # removable blocks); a section = Table 2's smallest client model (SmallestConfig)
    smallest: SmallestConfig | None = None
    distill: DistillConfig = field(default_factory=lambda: DistillConfig(enabled=True))

    def __post_init__(self) -> None:
        if self.epsilon is not None and self.explore_probability is not None:
            raise ValueError(
                "algorithm: set explore_probability only (epsilon is its deprecated alias: explore_probability = "
                "1 - epsilon)"
            )

    @property
    def stop_threshold(self) -> float:
        """Algorithm 2's threshold: the search draws another structure while a uniform draw exceeds it (so it
        explores with probability ``1 - stop_threshold``). The deprecated ``epsilon`` is used as given, so old
        configs draw exactly as before."""
        if self.epsilon is not None:
            return float(self.epsilon)
        p = EXPLORE_PROBABILITY_DEFAULT if self.explore_probability is None else self.explore_probability
        return 1.0 - float(p)

    @property
    def explore(self) -> float:
        """The probability that a test draws another structure (``explore_probability``, resolved)."""
        return 1.0 - self.stop_threshold
