"""Which torch device a client host trains on, and how much of a shared GPU it may take.

A Ray GPU fraction (``num_gpus=0.25``) is admission control only: Ray points ``CUDA_VISIBLE_DEVICES`` at the GPU and
counts shares, but nothing stops the process from filling the whole card. A host that shares a GPU therefore caps its
own CUDA caching allocator with ``torch.cuda.set_per_process_memory_fraction``; an allocation past the cap raises
``torch.cuda.OutOfMemoryError`` in that host instead of starving its neighbours. The cap bounds the allocator only:
each process's CUDA context (a few hundred MB) comes on top, so hosts whose shares add up to a whole GPU need
``backend.gpu_memory_fraction`` a little below their share (e.g. 0.22 at 0.25).

``choose_device`` is a pure function of the configuration and of what this process can see, so the decision is unit
tested without a GPU; ``use_device`` applies it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["DeviceChoice", "choose_device", "use_device"]

log = logging.getLogger(__name__)

DeviceSetting = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class DeviceChoice:
    """Where a host computes: ``"cpu"`` or ``"cuda:0"`` (the first visible GPU: the one Ray assigned to the actor),
    and the fraction of that GPU's memory its allocator may hold (``None``: no cap)."""

    device: str
    memory_fraction: float | None = None


def choose_device(
    setting: DeviceSetting, gpu_share: float, memory_fraction: float, cuda_available: bool
) -> DeviceChoice:
    """The device for a host given ``backend.device``, its GPU share (``backend.gpus_per_host``, which Ray reserved
    for the actor), ``backend.gpu_memory_fraction`` (0 = derive) and whether CUDA works in this process.

    * ``cpu``: always the CPU.
    * ``auto``: CUDA when the host holds a GPU share and CUDA works; without a share the CPU even on a GPU machine
      (using a GPU Ray did not reserve would bypass its scheduling). A share without CUDA (logical GPUs, e.g.
      ``ray start --num-gpus`` on a CPU box) falls back to the CPU.
    * ``cuda``: CUDA, or an error when this process cannot see a GPU.

    The cap is ``memory_fraction`` when set, else the share when it is below one whole GPU, else none.
    """
    if setting == "cpu":
        return DeviceChoice("cpu")
    if setting == "cuda" and not cuda_available:
        raise RuntimeError("backend.device is 'cuda' but this process sees no CUDA device (torch.cuda.is_available())")
    if setting == "auto" and (gpu_share <= 0 or not cuda_available):
        return DeviceChoice("cpu")
    if memory_fraction > 0:
        return DeviceChoice("cuda:0", min(memory_fraction, 1.0))
    if 0 < gpu_share < 1:
        return DeviceChoice("cuda:0", gpu_share)
    return DeviceChoice("cuda:0")


def use_device(
    setting: DeviceSetting, gpu_share: float, memory_fraction: float, host_id: int | None = None
) -> torch.device:
    """Decide the device of this process (``choose_device``) and apply its memory cap; returns the device."""
    cuda_available = setting != "cpu" and torch.cuda.is_available()
    if setting == "auto" and gpu_share > 0 and not cuda_available:
        log.warning("host %s holds a %.4g GPU share but sees no CUDA device; training on the CPU", host_id, gpu_share)
    choice = choose_device(setting, gpu_share, memory_fraction, cuda_available)
    device = torch.device(choice.device)
    if choice.memory_fraction is not None:
        # the cap is per process: the in-process backend's hosts share one process, so one cap bounds them together
        torch.cuda.set_per_process_memory_fraction(choice.memory_fraction, device)
        log.info("host %s: %s, allocator capped at %.4g of the GPU's memory", host_id, device, choice.memory_fraction)
    return device
