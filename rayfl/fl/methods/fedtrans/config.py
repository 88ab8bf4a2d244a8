"""FedTrans's configuration section (paper 002, ``algorithm.name: fedtrans``). Imports neither torch nor Ray: the
registry and ``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded

__all__ = ["FedTransConfig"]


@dataclass(frozen=True, kw_only=True)
class FedTransConfig:
    """FedTrans (paper 002): a family of models grown from ``model`` (a ``cellnet``) during the run, utility-based
    soft assignment and soft aggregation (``rayfl/fl/methods/fedtrans/algorithm.py``).

    A transformation fires after a round in which the newest model's degree of convergence (Eq. 1: the mean of its
    last ``gamma`` training-loss slopes of step ``doc_step`` rounds) is at most ``beta``, or at a round of
    ``force_rounds``; it selects the newest model's cells whose activeness (the clients' ``|mean grad| / |w|`` over
    the last ``activeness_rounds`` rounds it trained) is at least ``alpha`` x the largest, widens each by
    ``widen_factor`` (copies get ``noise`` x the tensor's standard deviation of Gaussian noise) or deepens it if it was
    widened last time, and adds the result as a new model. ``eta``: Eq. 5's decay per round the receiving model has
    trained. Ablations: ``soft_aggregation: false`` (each model averages its own clients only), ``share_large_to_small``
    (the paper's "l2s"), ``layer_selection: random``, ``warmup: false`` (new models start from fresh weights).
    ``rescale_cropped``: a smaller model's input columns of a dimension the receiving model has widened are divided
    by the widening factor before they enter its leading slice, so they are on the receiver's scale (``false``: the
    paper's literal crop, which mixes the parent's full-scale columns with the child's columns divided by ``K``).
    A client is compatible with a model when its round's training FLOPs fit its compute budget
    (``system.compute_limit_s``); every model is compatible without one.
    """

    name: Literal["fedtrans"] = "fedtrans"
    alpha: float = bounded(0.9, ge=0.0, le=1.0)
    beta: float = 0.003
    gamma: int = bounded(10, ge=1)
    doc_step: int = bounded(5, ge=1)
    widen_factor: int = bounded(2, ge=2)
    noise: float = bounded(0.05, ge=0.0)
    eta: float = bounded(0.9, gt=0.0, le=1.0)
    soft_aggregation: bool = True
    share_large_to_small: bool = False
    rescale_cropped: bool = True
    layer_selection: Literal["activeness", "random"] = "activeness"
    warmup: bool = True
    activeness_rounds: int = bounded(5, ge=1)
    force_rounds: tuple[int, ...] = ()
    max_models: int = bounded(8, ge=1)
    transform_classifier: bool = False  # the classifier may be picked (deepened: its width is the classes)
