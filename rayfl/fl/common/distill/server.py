"""Federated in-place distillation (paper 000, Sec. 3.3, Algorithm 1, Eq. 2, Appendices B and E.2).

After aggregation the server, holding no data, distils the global model into its own sub-nets on Gaussian noise:

1. draw ``n`` structures uniformly from the search space (every dimension uniformly from its allowed ratios of ``S``;
   0, which removes a block, only for skippable dimensions) with ``derive_rng(seed, "distill", round)``;
2. for ``T_SKD`` iterations, for each sub-net: draw ``K`` inputs (``distill.noise``: images from ``N(0, 1)``, since
   clients normalise their data to zero mean and unit variance, so this is the data's scale; token models below),
   take the teacher's soft labels ``softmax(teacher / T)`` and the KD loss
   ``T^2 * KL(soft labels || softmax(student / T))`` (batch mean);
3. update the global model, in one of two ways (``distill.update``):

   * ``copies`` (default; Algorithm 1 as Sec. 3.3 runs it: "for each sampled subnet, we train them with the soft
     labels from the global model ... After T_SKD iterations of training, we aggregate the weights of these n
     subnets into the global model"): every sub-net is a copy with its own fresh Adam (or SGD,
     ``distill.optimizer``), one step per iteration against the global model frozen at the aggregated parameters;
     after ``T_SKD`` iterations the copies are merged by the element-wise mean (``merge_copies``, each copy weighing
     1): an element held by ``c`` copies becomes the mean of those ``c`` values, one no copy holds keeps its value.
     Eq. (2) is the expected gradient of this procedure (App. B), not a different update;
   * ``shared`` (an ablation: Eq. 2 read as an update rule, ``fl/common/distill/shared.py``): the sub-nets are the
     first-k parts of the global weights themselves; their KD gradients with respect to the shared weights are
     averaged per element over the sub-nets that hold it and one Adam step is taken on the global model per
     iteration; the teacher is the current global model ``W^{t-1}``, so it moves with every step. Teacher and students
     being the same weights, they can agree on an output that ignores the input: issue 40 measured one round taking
     a character BERT at 22.2 % to a constant prediction (logits' spread over inputs 0.203 -> 0.001), where copies
     kept 0.115.

Both variants draw the same structures and the same noise batches in the same order, so they differ only in the
update. None of the bugs of the Plato prototype (ALGORITHMS.md section 12): the result is kept, the loss compares
probability distributions, gradients are cleared before every step, and there are ``T_SKD`` iterations (not
``T_SKD / K``).

Choices where the paper is open:

* **Noise per sub-net.** Algorithm 1 draws ``X_KD`` inside the loop over sub-nets (line 5), Eq. (2) writes one
  ``X_KD``; a fresh batch per sub-net and iteration is used, sub-net ``i`` reading from its own generator
  ``derive_torch_generator(seed, "distill-noise", round, i)`` (``kd.copy_noise_generator``; until issue 40's item 3
  one generator read in loop order), so the copies are independent and can train at the same time
  (``fl/common/distill/copies.py``: ``distill.workers``, ``distill.device``). Images: ``(K, C, H, W)`` in the
  model's normalised input space.
* **Token noise** (``distill.noise``). Characters are discrete, so the noise enters where the model first sees
  real-valued data, its embedding output (``ElasticCharBert.forward_hidden``), and the loss covers the logits at
  every position (the KL averaged over the ``K x seq_len`` positions). The paper draws noise with the statistics
  clients' normalised inputs have; the server has no data, so ``embedding`` (default) draws
  ``N(mean, std^2)`` with the statistics the embedding output has over uniformly random tokens, measured on the
  round's global model (``ElasticCharBert.embedding_statistics``: the mean per position and dimension, the standard
  deviation per dimension); the embeddings get no gradient and keep their values. ``tokens`` (ablation) feeds
  uniformly random token sequences through the model's own embedding, which then trains too. ``unit`` (rayfl's
  earlier choice) is ``N(0, 1)`` there, about 30 times the spread of real embedding outputs.
* **Modes.** The teacher runs in evaluation mode (no dropout: clean soft labels). The sub-nets run in training mode,
  as clients train them, so HeteroFL scalers divide by the width rate exactly as in local training; dropout, where a
  model has it, draws from the global torch generator, which is forked and seeded with
  ``derive_seed(seed, "distill-dropout", round, i)`` for copy ``i`` (``shared``: ``(seed, "distill-dropout",
  round)`` for the round), the caller's generator state untouched. The
  families build batch norms without running statistics, so both modes normalise with the batch's statistics.
* **Seeds.** Everything depends on ``(seed, round)`` only, so a round's distillation is reproducible.
* **Device.** The server distils in float32 on the CPU (``copies``: one thread per copy, ``distill.workers`` copies
  at once; ``shared``: the process's torch threads) or, ``copies`` with ``distill.device: cuda``, on the driver's
  GPU.
* **Sub-net construction.** Sub-nets are built on the meta device and given the first-k slices of the global
  tensors (copies: loaded, which is ``family.extract(params, first_k(units))`` without a random initialisation;
  shared: views, run with ``torch.func.functional_call``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from rayfl.core.messages import Params
from rayfl.core.rng import derive_rng, derive_seed, derive_torch_generator
from rayfl.data.federated import Rows
from rayfl.fl.common.distill.config import DistillConfig, NoiseMode
from rayfl.fl.common.distill.copies import merge_copies, train_copies
from rayfl.fl.common.distill.kd import (
    HiddenStateModel,
    allowed_ratios,
    kd_loss,
    load_sub_model,
    model_logits,
    noise_source,
    sample_structures,
    teacher_model,
)
from rayfl.fl.common.distill.shared import OPT_KEYS, shared_distill
from rayfl.models.elastic.family import ElasticFamily
from rayfl.models.inputs import InputSpec

__all__ = [
    "OPT_KEYS",
    "DistillResult",
    "HiddenStateModel",
    "allowed_ratios",
    "distillation_gap",
    "inplace_distill",
    "kd_loss",
    "load_sub_model",
    "merge_copies",
    "sample_structures",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistillResult:
    """The global parameters after a round's distillation and the optimizer state to keep in
    ``ServerState.opt_state`` (under ``OPT_KEYS``; empty unless ``optimizer_state: run``)."""

    params: Params
    opt_state: Params = field(default_factory=dict)


def inplace_distill(
    family: ElasticFamily,
    params: Params,
    cfg: DistillConfig,
    ratios: Sequence[float],
    *,
    num_subnets: int,
    seed: int,
    round_idx: int,
    input_spec: InputSpec,
    opt_state: Mapping[str, torch.Tensor] | None = None,
    pool: Rows | None = None,
) -> DistillResult:
    """Algorithm 1 on the global ``params`` (see module docstring).

    ``T_SKD = 0`` (``cfg.iterations``) or ``num_subnets = 0`` returns the parameters, and the optimizer state, as
    they are."""
    previous = dict(opt_state or {})
    kept = {k: v for k, v in previous.items() if k in OPT_KEYS}
    if cfg.iterations == 0 or num_subnets <= 0:
        return DistillResult(dict(params), kept)
    structures = sample_structures(family.space, ratios, num_subnets, derive_rng(seed, "distill", round_idx))
    if cfg.update == "copies":
        return DistillResult(
            train_copies(
                family, params, cfg, structures, seed=seed, round_idx=round_idx, input_spec=input_spec, pool=pool
            )
        )
    new, state = shared_distill(
        family,
        params,
        cfg,
        structures,
        seed=seed,
        round_idx=round_idx,
        input_spec=input_spec,
        opt_state=kept,
        pool=pool,
    )
    return DistillResult(new, state)


def distillation_gap(
    family: ElasticFamily,
    params: Params,
    structures: Sequence[Sequence[int]],
    *,
    input_spec: InputSpec,
    batch_size: int,
    temperature: float = 1.0,
    seed: int = 0,
    noise: NoiseMode = "embedding",
) -> float:
    """Mean distillation loss (``kd_loss``) between the global model of ``params`` and its first-k sub-nets
    ``structures`` on fresh noise inputs (``noise``, as ``distill.noise``; one batch of ``batch_size`` per sub-net
    from ``derive_torch_generator(seed, "distill-gap")``), in the modes the distillation uses; a diagnostic."""
    teacher = teacher_model(family, params)
    tokens = input_spec.input_kind == "tokens"
    source = noise_source(teacher, input_spec, batch_size, noise)
    gen = derive_torch_generator(seed, "distill-gap")
    total = 0.0
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(derive_seed(seed, "distill-gap-dropout"))
        for units in structures:
            student = load_sub_model(family, params, units)
            student.train()
            x = source.draw(gen)
            total += float(kd_loss(model_logits(student, x, tokens), model_logits(teacher, x, tokens), temperature))
    return total / max(1, len(structures))
