"""HeteroFL's configuration section (``algorithm.name: heterofl``). Imports neither torch nor Ray: the registry and
``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfl.config.fields import bounded, width_ratios
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.common.widths import HETEROFL_RATES

__all__ = ["HeteroFLConfig"]


@dataclass(frozen=True, kw_only=True)
class HeteroFLConfig:
    """HeteroFL (Diao et al., ICLR 2021): each client the largest uniform width rate of ``rates`` that fits its
    budgets, first-k channels; count-normalised element-wise mean; classifier rows of the client's labels only
    (``label_mask``, with absent classes' logits masked to 0 in the loss); static BN on the server for evaluation
    (``static_bn``, models with batch norm only); ``official_init``: the official code's initial model (norm weight
    1 and bias 0, linear biases 0); the static-BN pass runs over a seeded shuffle of the pooled training set
    (``static_bn_shuffle``) in batches of ``static_bn_batch_size`` samples, as the official code, on
    ``static_bn_workers`` threads (0: every core; the same statistics whatever the count).

    The official code's training set-up as defaults, so that a paper setting run with ``algorithm.name=heterofl`` is
    set up as its authors ran it: ``grad_clip_norm``, the gradient-norm clipping of every local step (both official
    codes clip at 1), used by the method in place of ``train.grad_clip_norm`` (0: no clipping; null:
    ``train.grad_clip_norm``); ``act: official`` replaces ``model.act`` by the activation of the official codes'
    models, which is the model family's default (ResNet: ReLU; ViT and the character BERT: GELU, as the official
    transformers), since paper 000 adds ReLU6 for its own search space only (Sec. 3.4: its blocks can be skipped) and
    says nothing about its baselines' activation; ``act: model`` keeps ``model.act`` (e.g. ReLU6). Models without an
    activation choice keep theirs; in a run with phases, the phases must agree on the activation."""

    name: Literal["heterofl"] = "heterofl"
    rates: tuple[float, ...] = width_ratios(HETEROFL_RATES)
    label_mask: bool = True
    static_bn: bool = True
    official_init: bool = True
    static_bn_shuffle: bool = True
    static_bn_batch_size: int = 10
    # threads the static-BN pass runs its chunks on at once, one intra-op thread each (0 = every core this process may
    # use; the clients are idle meanwhile); the statistics are the same bits whatever the count. 1 where runs share
    # the cores (two runs side by side). Only with backend.server_threads 1 (the default)
    static_bn_workers: int = bounded(0, ge=0)
    grad_clip_norm: float | None = bounded(1.0, ge=0.0)
    act: Literal["official", "model"] = "official"
    distill: DistillConfig = field(default_factory=DistillConfig)
