"""The ``copies`` update of federated in-place distillation (paper 000, Algorithm 1; ``distill/server.py`` documents
the method): the ``n`` sampled sub-nets are trained as independent copies against the frozen global model, then
merged into it element by element.

How the copies run (issue 40, item 3: T_SKD = 100 at a cost of minutes):

* **Each copy depends only on ``(seed, round, its index)``.** Copy ``i`` draws its noise from its own generator,
  ``derive_torch_generator(seed, "distill-noise", round, i)``, and, where the model has dropout, its masks from the
  global generator seeded with ``derive_seed(seed, "distill-dropout", round, i)`` for its own training only. Nothing
  one copy does changes another's inputs, so the copies can run in any order or at the same time with the same
  result.
* **Copies at the same time** (``distill.workers``; 0 = every core this process may use, ``os.sched_getaffinity``:
  the clients are idle while the server distils): on the CPU the copies are spread over that many Python threads
  (torch releases the interpreter lock inside its kernels), each computing with one intra-op thread. Every copy is
  computed by one thread whatever ``workers`` is, so the result does not depend on it: bit for bit the same with 1,
  2 or 16 workers, and on any machine (unlike ``backend.server_threads``, which stays 1 for the driver's other
  work). Set ``distill.workers: 1`` where runs share the cores (two runs side by side, one thread each).
  A model with dropout runs its copies one after another (dropout reads the process-wide generator, which
  concurrent copies would interleave).
* **Why not one batched forward for all sub-nets.** The sub-nets have different widths and depths; batching them
  means padding each to the widest and masking, i.e. computing every copy at full width. Measured on setting 1
  (ResNet18 at 1/16 width, K = 64, one CPU thread): ``torch.func.vmap`` over 10 stacked full-width copies takes
  1158 ms per forward/backward, a loop over the same 10 full-width copies 840 ms, and the 10 sampled sub-nets
  themselves less (they are narrower): batching loses on the CPU, whose small-channel convolutions are bound by
  their kernels, not by the interpreter. On a GPU (an H200, ``distill.device: cuda``) the paper-size setting 1
  (ResNet18, 11.2 M parameters, n = 10, T_SKD = 100, K = 64) takes 22.3 s per round, as much CPU time as wall
  time: the host launching kernels one by one bounds it, which CUDA graphs of a copy's step (fixed shapes over its
  T_SKD steps) would remove; not built, as no GPU was at hand to test them (``benchmarks/distill_server.py``).
* **Optimizer.** Adam runs torch's fused kernel (one call per step instead of one per tensor).
* **Device** (``distill.device``): ``cpu`` (default), ``cuda`` (the driver's first visible GPU) or ``auto`` (CUDA
  when this process sees one). Noise is drawn on the CPU in every case and moved, so a GPU run distils on the same
  inputs as a CPU run; the merge is done on the CPU. GPU kernels differ from CPU kernels, so a GPU run's records are
  reproducible on GPUs, not equal to a CPU run's.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from rayfl.core.cores import usable_cores
from rayfl.core.messages import ClientUpdate, Params
from rayfl.core.reducers import MaskedWeightedMean, Partial
from rayfl.core.rng import derive_seed
from rayfl.data.federated import Rows
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.common.distill.kd import (
    NoiseSource,
    copy_noise_generator,
    kd_loss,
    load_sub_model,
    model_logits,
    noise_source,
    teacher_model,
)
from rayfl.models.elastic.family import ElasticFamily
from rayfl.models.elastic.spec import first_k
from rayfl.models.inputs import InputSpec, has_dropout

__all__ = ["distill_device", "distill_workers", "merge_copies", "train_copies"]

log = logging.getLogger(__name__)


def distill_device(setting: str) -> torch.device:
    """``distill.device`` resolved in this process: ``cuda`` needs a visible GPU, ``auto`` takes one if present."""
    if setting == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if setting == "cuda" and not available:
        raise RuntimeError("distill.device is 'cuda' but this process sees no CUDA device (torch.cuda.is_available())")
    return torch.device("cuda:0" if available else "cpu")


def distill_workers(setting: int, device: torch.device, num_copies: int, dropout: bool) -> int:
    """How many copies train at once: ``distill.workers`` (0 = the cores this process may use), one on a GPU (its
    kernels queue on one stream) or for a model with dropout, never more than there are copies."""
    if device.type != "cpu" or dropout:
        return 1
    wanted = setting or usable_cores()
    return max(1, min(wanted, num_copies))


def train_copies(
    family: ElasticFamily,
    params: Params,
    cfg: DistillConfig,
    structures: Sequence[tuple[int, ...]],
    *,
    seed: int,
    round_idx: int,
    input_spec: InputSpec,
    pool: Rows | None = None,
) -> Params:
    """The global parameters after the ``copies`` update (see the module docstring); ``pool``: the training samples
    ``distill.noise: data`` draws from."""
    device = distill_device(cfg.device)
    cpu_teacher = teacher_model(family, params)
    # the noise's statistics (token models) are read from the global model on the CPU, where the noise is drawn
    source = noise_source(cpu_teacher, input_spec, cfg.batch_size, cfg.noise, pool)
    teacher = cpu_teacher.to(device)
    dropout = has_dropout(cpu_teacher)  # the global model: every module a sub-net can have
    workers = distill_workers(cfg.workers, device, len(structures), dropout)
    tokens = input_spec.input_kind == "tokens"

    def train(index: int) -> nn.Module:
        with _dropout_seeded(dropout, device, derive_seed(seed, "distill-dropout", round_idx, index)):
            return _train_copy(
                family, params, cfg, structures[index], teacher, source, tokens, device, seed, round_idx, index
            )

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per copy whatever `workers` is: the result does not depend on it
    try:
        if workers == 1:
            students = [train(i) for i in range(len(structures))]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rayfl-distill") as executor:
                students = list(executor.map(train, range(len(structures))))
    finally:
        torch.set_num_threads(threads)
    return merge_copies(family, params, structures, [s.to("cpu") for s in students])


def _train_copy(
    family: ElasticFamily,
    params: Params,
    cfg: DistillConfig,
    units: tuple[int, ...],
    teacher: nn.Module,
    source: NoiseSource,
    tokens: bool,
    device: torch.device,
    seed: int,
    round_idx: int,
    index: int,
) -> nn.Module:
    """Copy ``index``: ``T_SKD`` steps on its own noise against ``teacher``; returns the trained sub-net."""
    student = load_sub_model(family, params, units).to(device)
    student.train()
    trainable = [p for p in student.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(trainable, lr=cfg.lr)
    else:  # fused: one kernel per step instead of one per tensor
        opt = torch.optim.Adam(trainable, lr=cfg.lr, fused=True)
    noise = copy_noise_generator(seed, round_idx, index)

    for _ in range(cfg.iterations):
        x = source.draw(noise).to(device)
        with torch.no_grad():
            soft = model_logits(teacher, x, tokens)
        opt.zero_grad(set_to_none=True)
        loss = kd_loss(model_logits(student, x, tokens), soft, cfg.temperature)
        loss.backward()  # type: ignore[no-untyped-call]  # torch stubs leave backward untyped
        opt.step()
    return student


@contextlib.contextmanager
def _dropout_seeded(dropout: bool, device: torch.device, seed: int) -> Iterator[None]:
    """Dropout reads the process-wide generator: a copy of a model with dropout (its copies run one at a time) gets
    it seeded with its own seed, and the caller's state back afterwards; a model without dropout reads no global
    generator, and concurrent copies leave it alone."""
    if not dropout:
        yield
        return
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.manual_seed(seed)
        yield


def merge_copies(
    family: ElasticFamily, params: Params, structures: Sequence[tuple[int, ...]], students: Sequence[nn.Module]
) -> Params:
    """The global parameters after the ``copies`` update: every element the sub-nets ``students`` (first-k, of
    ``structures``) hold becomes the mean of their values there (each sub-net weighing 1), the rest keep theirs."""
    reducer = MaskedWeightedMean()
    shapes = {k: v.shape for k, v in params.items()}
    partial: Partial = {}
    for i, (units, student) in enumerate(zip(structures, students, strict=True)):
        values, slices = family.scatter(student, first_k(units))
        values = {k: v for k, v in values.items() if k in shapes}
        if not all(bool(torch.isfinite(v).all()) for v in values.values()):
            log.warning("in-place distillation: sub-net %d %s diverged (non-finite weights); left out", i, units)
            continue
        update = ClientUpdate(
            client_id=i,
            weight=1.0,
            values=values,
            slices={k: s for k, s in slices.items() if k in values},
            num_examples=0,
            train_loss=math.nan,
            num_steps=0,
        )
        reducer.accumulate(partial, update, shapes)
    merged, _ = reducer.finalize(partial, params)
    return merged
