"""SplitMix's configuration section (``algorithm.name: splitmix``). Imports neither torch nor Ray: the registry and
``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["SplitMixConfig"]


@dataclass(frozen=True, kw_only=True)
class SplitMixConfig:
    """SplitMix (Hong, Wang, Wang, Zhou, ICLR 2022): the model (``model.name: ensemble``) is split into independent
    base models; each client trains as many of them as fit its round's budgets, the first drawn from a shuffled
    round-robin over the bases, the rest at random; each base is averaged over the clients that trained it, weighted
    by samples. A client predicts with the mean logits of as many bases as it can run
    (``rayfl/fl/methods/splitmix/algorithm.py``)."""

    name: Literal["splitmix"] = "splitmix"
