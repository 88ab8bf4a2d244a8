"""The configuration of federated in-place distillation (paper 000, Sec. 3.3), shared by every method that can
distil on the server after aggregation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded

__all__ = ["DistillConfig", "NoiseMode"]

NoiseMode = Literal["embedding", "tokens", "unit", "data"]  # distill.noise: what the sub-nets are fed (DistillConfig)


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """Federated in-place distillation (paper 000, Sec. 3.3, Algorithm 1), run on the server after aggregation.

    ``subnets`` sub-nets (n; 0 = the round's ``clients_per_round``, as the paper) are drawn uniformly from the search
    space (``ratios``, its S; empty: the method's own ratios or rates). Each of ``iterations`` (T_SKD) iterations gives
    every sub-net ``batch_size`` (K) fresh Gaussian inputs and a KL loss (``temperature``) against the global model's
    outputs. ``update``: ``copies`` (the default, Algorithm 1 as Sec. 3.3 runs it: "for each sampled subnet, we train
    them with the soft labels from the global model ... After T_SKD iterations of training, we aggregate the weights
    of these n subnets into the global model") trains a copy of each sub-net with its own optimizer (``lr``) against
    the aggregated global model frozen as the teacher, then averages the copies into the elements they hold, the
    rest unchanged; ``shared`` (an ablation: Eq. 2 read as an update rule) runs the sub-nets on the global model's
    own weights and takes one Adam step on them per iteration with the sub-nets' gradients averaged per element, the
    teacher being those same live weights, so teacher and students can settle on an output that ignores the input
    (issue 40: one round took a model at 22 % to a constant prediction). ``optimizer_state`` (``shared`` only):
    ``round`` starts Adam afresh each round, ``run`` keeps its moments across rounds in ``ServerState.opt_state``.
    ``teacher`` (``shared`` only): ``step`` is Eq. 2's ``W^{t-1}``, the global model before each step; ``round``
    freezes it at the aggregated model for the whole round. ``optimizer``: ``adam`` (the paper's) or ``sgd`` (plain
    steps of ``lr`` times the gradient: an ablation, whose steps scale with the KD gradient where Adam's are about
    ``lr`` whatever its size). ``noise`` (token models only; images take ``N(0, 1)`` in their normalised input space,
    as clients normalise theirs): ``embedding`` (default) draws Gaussian hidden states with the per-dimension mean
    and standard deviation of the global model's embedding output over uniformly random tokens, measured each
    round; ``tokens`` feeds uniformly random token sequences through the model's own embedding (an ablation);
    ``unit`` is ``N(0, 1)`` at the embedding output (rayfl's earlier choice, about 30 times the real scale).
    ``data`` (any model; a control, not paper 000's method, whose server holds no data) feeds samples of the pooled
    training set instead of noise, drawn from each copy's own generator: it separates what the noise does from what
    the distillation's steps do.
    ``lr_schedule``: ``constant`` (the paper's Adam at ``lr`` every round; the paper gives the distillation no
    schedule) or ``clients`` (an ablation: ``lr`` times the factor by which the clients' schedule,
    ``train.lr_schedule``, has lowered their learning rate that round, so the server's steps shrink as theirs do).
    ``workers`` (``copies``): how many copies train at once on the CPU, each on one thread (0 = every core the
    driver may use); the result is the same for every value. ``device`` (``copies``): where the copies
    train, ``cpu``, ``cuda`` (the driver's GPU) or ``auto`` (CUDA when the driver sees one); see
    ``fl/common/distill/copies.py``.
    """

    enabled: bool = False
    subnets: int = bounded(0, ge=0)
    iterations: int = bounded(100, ge=0)
    batch_size: int = bounded(64, ge=1)
    lr: float = bounded(1e-3, gt=0.0)
    temperature: float = bounded(1.0, gt=0.0)
    ratios: tuple[float, ...] = ()
    update: Literal["copies", "shared"] = "copies"
    optimizer_state: Literal["round", "run"] = "round"
    teacher: Literal["step", "round"] = "step"
    optimizer: Literal["adam", "sgd"] = "adam"
    noise: NoiseMode = "embedding"
    lr_schedule: Literal["constant", "clients"] = "constant"
    workers: int = bounded(0, ge=0)
    device: Literal["cpu", "cuda", "auto"] = "cpu"
