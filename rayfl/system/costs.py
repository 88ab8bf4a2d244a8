"""What a client's assignment costs it: peak training memory, bytes down and up, training FLOPs per sample.

Elastic models use the family's vectorised ``CostModel`` on the assignment's unit counts. A fixed model (the
char-LSTM, for instance) has one cost, measured once: parameters from the module, and saved activations and FLOPs of
one forward pass at batch sizes 1 and 2 (so per-sample and fixed parts separate), the same accounting as
``CostModel``.

Upload bytes follow the run's ``compression``: under QSGD each uploaded tensor costs its packed codes plus a float32
norm (``rayfl.system.compression.tensor_upload_bytes``, the formula the client hosts report), computed exactly
from the assignment's slices. The elastic ``CostModel`` that algorithms use for their fit checks gets a conservative
upload factor instead (it sees only parameter counts): ``bits / 8`` bytes per element plus 5 bytes (the norm and at
most one byte of padding) for every tensor of the global model, an upper bound of the exact bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rayfl.config.model import ModelConfig
from rayfl.config.sections import CompressionConfig, TrainConfig
from rayfl.core.messages import Assignment
from rayfl.models import InputSpec, build_model
from rayfl.models.elastic.cost import CostModel, optimizer_slots, saved_tensors
from rayfl.models.elastic.family import ElasticFamily
from rayfl.system.compression import NORM_BYTES, upload_bytes
from rayfl.system.work import TRAIN_FLOPS_PER_FORWARD, samples_per_round

__all__ = ["TRAIN_FLOPS_PER_FORWARD", "AssignmentCosts", "CostOracle", "samples_per_round"]


@dataclass(frozen=True)
class AssignmentCosts:
    """Per client (arrays aligned with the assignments asked about)."""

    memory: np.ndarray  # peak training bytes, runtime overhead included
    bytes_down: np.ndarray
    bytes_up: np.ndarray
    train_flops_per_sample: np.ndarray


class CostOracle:
    """Costs of assignments for one model and local-training set-up."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        spec: InputSpec,
        train: TrainConfig,
        shapes: Mapping[str, tuple[int, ...]],
        overhead_bytes: float = 0.0,
        dtype_bytes: int = 4,
        compression: CompressionConfig | None = None,
    ) -> None:
        from rayfl.models.families import FAMILIES, build_family

        self.model_cfg = model_cfg
        self._rebuild = (spec, train, overhead_bytes)  # for the other global models of a multi-model run
        self.overhead_bytes = float(overhead_bytes)  # the runtime overhead inside every memory need
        self._siblings: dict[ModelConfig, CostOracle] = {}
        self.shapes = dict(shapes)
        self.dtype_bytes = dtype_bytes
        self.compression = compression or CompressionConfig()
        self.batch = train.batch_size
        self.elastic: CostModel | None = None
        self.family: ElasticFamily | None = None
        if type(model_cfg) in FAMILIES:
            family = build_family(model_cfg, spec)
            self.family = family
            self.full_units = np.asarray(family.full_units)
            self.elastic = CostModel(
                family,
                train.batch_size,
                train.optimizer,
                train.momentum,
                dtype_bytes,
                overhead_bytes,
                upload_compression=self._upload_factor(len(self.shapes)),
            )
        else:
            self.fixed = _measure_fixed(build_model(model_cfg, spec), spec, train, dtype_bytes, overhead_bytes)

    def costs(self, assignments: Sequence[Assignment]) -> AssignmentCosts:
        n = len(assignments)
        # one count per distinct assignment object: a method that gives everyone one assignment (FedAvg) is priced
        # once, whatever the number of clients (the pre-flight check prices a whole population)
        by_object: dict[int, list[int]] = {}
        numels = [
            by_object[id(a)] if id(a) in by_object else by_object.setdefault(id(a), self._numels(a))
            for a in assignments
        ]
        down = np.array([sum(e) * self.dtype_bytes for e in numels], dtype=np.float64)
        if self.compression.kind == "none":
            up = down.copy()
        else:
            up = np.array([upload_bytes(e, self.compression, self.dtype_bytes) for e in numels], dtype=np.float64)
        if self.elastic is not None and n == 0:
            memory, flops = np.zeros(0), np.zeros(0)
        elif self.elastic is not None:
            units = np.stack([np.asarray(a.units) if a.units is not None else self.full_units for a in assignments])
            c = self.elastic.evaluate(units) if n else None
            memory = c.peak_memory if c is not None else np.zeros(0)
            flops = c.flops if c is not None else np.zeros(0)
        else:
            memory = np.full(n, self.fixed[0])
            flops = np.full(n, self.fixed[1])
        return AssignmentCosts(memory, down, up, TRAIN_FLOPS_PER_FORWARD * flops)

    def for_model(self, config: ModelConfig) -> CostOracle:
        """The oracle of another global model's architecture under the same training set-up (built once)."""
        if config == self.model_cfg:
            return self
        oracle = self._siblings.get(config)
        if oracle is None:
            spec, train, overhead = self._rebuild
            with torch.device("meta"):
                state = build_model(config, spec).state_dict()
            shapes = {k: tuple(v.shape) for k, v in state.items() if v.is_floating_point()}
            oracle = CostOracle(config, spec, train, shapes, overhead, self.dtype_bytes, self.compression)
            self._siblings[config] = oracle
        return oracle

    def model_costs(self, assignments: Sequence[Assignment], models: Sequence[ModelConfig]) -> AssignmentCosts:
        """``costs`` when the run holds several global models: each assignment priced on the architecture its
        ``model_id`` names in ``models`` (empty ``models``: the run's one model)."""
        if not models:
            return self.costs(assignments)
        ids = np.array([a.model_id for a in assignments], dtype=np.int64)
        out = AssignmentCosts(*(np.zeros(len(assignments)) for _ in range(4)))
        for model_id in np.unique(ids):
            rows = np.flatnonzero(ids == model_id)
            part = self.for_model(models[int(model_id)]).costs([assignments[int(i)] for i in rows])
            for field_name in ("memory", "bytes_down", "bytes_up", "train_flops_per_sample"):
                getattr(out, field_name)[rows] = getattr(part, field_name)
        return out

    def _numels(self, a: Assignment) -> list[int]:
        """Elements the assignment moves per tensor: its slice of every tensor it does not skip."""
        numels: list[int] = []
        for name, shape in self.shapes.items():
            if name in a.skip:
                continue
            tslice = a.slices.get(name)
            # math.prod, not np.prod: the driver prices every sampled client's tensors each round, and numpy's
            # reduction costs microseconds per call on a handful of integers (a millisecond a round at 20 clients)
            if tslice is None:
                numels.append(math.prod(shape))
            else:
                numels.append(math.prod(s if i is None else len(i) for s, i in zip(shape, tslice.index, strict=True)))
        return numels

    def _upload_factor(self, num_tensors: int) -> float | Callable[[np.ndarray], np.ndarray]:
        """The elastic cost model's factor on upload bytes: 1 uncompressed; under QSGD an upper bound of the packed
        codes and per-tensor norms over the float bytes, as a function of the parameter counts."""
        comp = self.compression
        if comp.kind == "none":
            return 1.0
        per_element = comp.bits / 8.0
        per_tensor = float(NORM_BYTES + 1) * num_tensors
        dtype_bytes = float(self.dtype_bytes)

        def factor(params: np.ndarray) -> np.ndarray:
            p = np.maximum(np.asarray(params, dtype=np.float64), 1.0)
            return np.asarray((p * per_element + per_tensor) / (p * dtype_bytes), dtype=np.float64)

        return factor


def _measure_fixed(
    model: nn.Module, spec: InputSpec, train: TrainConfig, dtype_bytes: int, overhead: float
) -> tuple[float, float]:
    """(peak training bytes at the batch size, forward FLOPs per sample) of a fixed model, measured on the CPU."""
    model.train()
    try:
        (s1, f1), (s2, _) = (_saved_and_flops(model, spec, batch) for batch in (1, 2))
        per_sample, fixed = s2 - s1, 2 * s1 - s2
    except ValueError:  # batch norm refuses one sample per channel in training (e.g. a ResNet's last stage)
        (s2, f2), (s3, _) = (_saved_and_flops(model, spec, batch) for batch in (2, 3))
        per_sample, fixed, f1 = s3 - s2, 3 * s2 - 2 * s3, f2 / 2
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    f1 += _recurrent_flops(model, spec)
    slots = optimizer_slots(train.optimizer, train.momentum)
    memory = overhead + params * dtype_bytes * (2 + slots) + fixed + train.batch_size * per_sample
    return memory, f1


def _saved_and_flops(model: nn.Module, spec: InputSpec, batch: int) -> tuple[float, float]:
    """Bytes autograd saves and forward FLOPs of one training forward pass on ``batch`` random samples."""
    shape = (batch, *spec.sample_shape)
    x = torch.randint(0, max(spec.num_classes, 1), shape) if spec.input_kind == "tokens" else torch.randn(shape)
    saved, _, flops = saved_tensors(model, x)
    return float(sum(t.numel() * t.element_size() for t in saved)), flops


def _recurrent_flops(model: nn.Module, spec: InputSpec) -> float:
    """Forward FLOPs per sample of recurrent layers, which ``FlopCounterMode`` does not see inside fused CPU kernels:
    a multiply-add per weight per position (gate nonlinearities are ignored, as for every other layer)."""
    positions = spec.sample_shape[0] if spec.input_kind == "tokens" else 1
    weights = sum(
        p.numel()
        for m in model.modules()
        if isinstance(m, nn.RNNBase)
        for name, p in m.named_parameters()
        if name.startswith("weight")
    )
    return 2.0 * weights * positions
