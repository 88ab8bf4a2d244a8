"""Client hosts on CUDA: models and batches on the GPU, updates back as CPU tensors, a real per-process memory cap.

Skipped without a CUDA device (the CPU path is what the rest of the suite exercises, bit for bit).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rayfl.core.messages import Assignment, TrainTask
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.driver import run_experiment
from tests.helpers import tiny_config, tiny_image_dataset

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA0 = torch.device("cuda:0")


def _allocator_cap(device: torch.device) -> float | None:
    """The per-process memory fraction, where this torch can read it back."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return None if getter is None else float(getter(device))


def _assert_capped_at(fraction: float, device: torch.device) -> None:
    cap = _allocator_cap(device)
    if cap is not None:
        assert cap == pytest.approx(fraction)
    # whatever the torch version: an allocation past the cap fails in this process
    total = torch.cuda.get_device_properties(device).total_memory
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(int(total * (fraction + 0.05)), dtype=torch.uint8, device=device)


def _tasks(seed: int) -> list[TrainTask]:
    return [TrainTask(client_id=c, round_idx=0, seed=seed, lr=0.05, assignment=Assignment()) for c in range(4)]


def test_in_process_hosts_train_on_cuda_under_the_cap() -> None:
    dataset = tiny_image_dataset()
    cfg = tiny_config(kind="local", num_hosts=2, gpus_per_host=0.25)
    try:
        setup = build_setup(cfg, dataset)
        backend = build_backend(cfg, setup)
        host = backend.hosts[0]  # type: ignore[attr-defined]
        assert host.device == CUDA0 and next(host.model.parameters()).device == CUDA0
        aggregate, outcomes = backend.train_and_reduce(_tasks(cfg.seed), setup.params)
        assert all(o.failure is None for o in outcomes)
        assert all(v.device.type == "cpu" for v in aggregate.params.values())
        _assert_capped_at(0.25, CUDA0)
        on_gpu = run_experiment(cfg, write=False, dataset=dataset)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, CUDA0)  # the cap is process-wide: give the rest back
        torch.cuda.empty_cache()
    on_cpu = run_experiment(tiny_config(kind="local", num_hosts=2), write=False, dataset=dataset)
    for g, c in zip(on_gpu.records, on_cpu.records, strict=True):
        # what does not depend on arithmetic is equal; losses agree to float32-kernel differences
        assert (g.clients_run, g.bytes_down, g.bytes_up) == (c.clients_run, c.bytes_down, c.bytes_up)
        assert g.train_loss == pytest.approx(c.train_loss, rel=5e-2)
        assert g.test_loss == pytest.approx(c.test_loss, rel=5e-2)
    assert all(v.device.type == "cpu" for v in on_gpu.state.params.values())


def _device_and_cap(host: Any) -> tuple[str, float | None, list[Any]]:
    import ray

    return str(host.device), _allocator_cap(host.device), list(ray.get_gpu_ids())


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_ray_hosts_with_half_a_gpu_each_cap_their_allocators() -> None:
    import ray

    cfg = tiny_config(kind="ray", num_hosts=2, cpus_per_host=0.25, gpus_per_host=0.5)
    setup = build_setup(cfg, tiny_image_dataset())
    backend = build_backend(cfg, setup)
    try:
        seen = ray.get([h.__ray_call__.remote(_device_and_cap) for h in backend.hosts])  # type: ignore[attr-defined]
        aggregate, outcomes = backend.train_and_reduce(_tasks(cfg.seed), setup.params)
    finally:
        backend.close()
    for device, cap, gpu_ids in seen:
        assert device == "cuda:0" and len(gpu_ids) == 1
        assert cap is None or cap == pytest.approx(0.5)
    assert all(o.failure is None for o in outcomes)
    assert all(v.device.type == "cpu" for v in aggregate.params.values())


def _distil(device: str, **cfg_fields: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The global parameters of a small batch-norm ResNet before and after one round of in-place distillation."""
    from rayfl.config.model import ResNetConfig
    from rayfl.fl.common.distill.config import DistillConfig
    from rayfl.fl.common.distill.server import inplace_distill
    from rayfl.models.elastic import ResNetFamily
    from rayfl.models.inputs import InputSpec

    family = ResNetFamily(
        ResNetConfig(depth=18, widths=(8, 16, 16, 16), norm="bn"), in_channels=3, num_classes=4, image_size=8
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        params = {k: v.detach() for k, v in family.global_model().state_dict().items()}
    cfg = DistillConfig(enabled=True, iterations=8, batch_size=16, device=device, **cfg_fields)  # type: ignore[arg-type]
    spec = InputSpec("image", 4, (3, 8, 8))
    out = inplace_distill(family, params, cfg, (0.0, 0.5, 1.0), num_subnets=4, seed=3, round_idx=1, input_spec=spec)
    assert all(v.device.type == "cpu" for v in out.params.values())
    return params, out.params


def test_in_place_distillation_on_cuda_moves_the_weights_as_on_the_cpu() -> None:
    """``distill.device: cuda``: the copies train on the GPU from the same noise (drawn on the CPU) and the merged
    weights come back as CPU tensors. With plain SGD steps (proportional to the gradient) each tensor's change agrees
    with the CPU's within 5 % (TF32 and other float32 kernel differences); Adam would amplify them where a gradient
    is near zero (its step is about lr whatever the gradient's size)."""
    before, on_cpu = _distil("cpu", optimizer="sgd", lr=0.05)
    _, on_gpu = _distil("cuda", optimizer="sgd", lr=0.05)
    moved = [k for k in before if not torch.equal(on_cpu[k], before[k])]
    assert moved
    for k in moved:
        change_cpu, change_gpu = on_cpu[k] - before[k], on_gpu[k] - before[k]
        gap = float((change_gpu - change_cpu).norm() / change_cpu.norm())
        assert gap < 0.05, f"{k}: the GPU's change differs from the CPU's by {gap:.3g} of its size"
