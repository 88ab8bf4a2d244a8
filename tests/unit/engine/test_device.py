"""Which device a client host trains on and how much of a shared GPU it may take (no GPU needed)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rayfl.config.sections import BackendConfig
from rayfl.core.errors import ConfigError
from rayfl.engine.driver import run_experiment
from rayfl.engine.exec.device import DeviceChoice, choose_device, use_device
from rayfl.experiment.loader import load_config, validate_semantics
from rayfl.experiment.schema import ExperimentConfig
from tests.helpers import tiny_config, tiny_image_dataset


@pytest.mark.parametrize(
    ("setting", "share", "fraction", "cuda", "expected"),
    [
        # the CPU whenever asked for, or when the host holds no GPU share, even on a GPU machine
        ("cpu", 0.5, 0.0, True, DeviceChoice("cpu")),
        ("auto", 0.0, 0.0, True, DeviceChoice("cpu")),
        ("auto", 0.0, 0.3, True, DeviceChoice("cpu")),
        # a share of logical GPUs on a machine without CUDA falls back to the CPU
        ("auto", 0.25, 0.0, False, DeviceChoice("cpu")),
        # a fractional share caps the allocator at that share; a whole GPU is not capped
        ("auto", 0.25, 0.0, True, DeviceChoice("cuda:0", 0.25)),
        ("auto", 1.0, 0.0, True, DeviceChoice("cuda:0")),
        # an explicit fraction wins over the share
        ("auto", 0.25, 0.2, True, DeviceChoice("cuda:0", 0.2)),
        ("auto", 1.0, 0.9, True, DeviceChoice("cuda:0", 0.9)),
        # 'cuda' without a share (the in-process backend on a workstation): uncapped unless a fraction is given
        ("cuda", 0.0, 0.0, True, DeviceChoice("cuda:0")),
        ("cuda", 0.0, 0.5, True, DeviceChoice("cuda:0", 0.5)),
        ("cuda", 0.5, 0.0, True, DeviceChoice("cuda:0", 0.5)),
    ],
)
def test_choose_device(setting: str, share: float, fraction: float, cuda: bool, expected: DeviceChoice) -> None:
    assert choose_device(setting, share, fraction, cuda) == expected  # type: ignore[arg-type]


def test_cuda_without_a_visible_gpu_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="sees no CUDA device"):
        choose_device("cuda", 0.5, 0.0, cuda_available=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback of a machine without CUDA")
def test_a_gpu_share_without_cuda_trains_on_the_cpu_and_sets_no_cap(caplog: pytest.LogCaptureFixture) -> None:
    assert use_device("auto", 0.25, 0.0, host_id=3) == torch.device("cpu")
    assert "host 3 holds a 0.25 GPU share but sees no CUDA device" in caplog.text
    assert use_device("cpu", 0.25, 0.5) == torch.device("cpu")


def test_a_gpu_share_on_a_cpu_machine_gives_the_cpu_numbers() -> None:
    """gpus_per_host falls back to the CPU without CUDA and changes nothing there: the same numbers, bit for bit."""
    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine the share moves the hosts to the GPU")
    dataset = tiny_image_dataset()
    base = run_experiment(tiny_config(kind="local", num_hosts=2), write=False, dataset=dataset)
    shared = run_experiment(
        tiny_config(kind="local", num_hosts=2, gpus_per_host=0.5, gpu_memory_fraction=0.4), write=False, dataset=dataset
    )
    for a, b in zip(base.records, shared.records, strict=True):
        assert (a.train_loss, a.test_acc, a.test_loss) == (b.train_loss, b.test_acc, b.test_loss)
    for name, value in base.state.params.items():
        assert torch.equal(value, shared.state.params[name]), name


def test_config_rules_for_devices() -> None:
    cfg = load_config(None, ["backend.device=cuda", "backend.gpus_per_host=0.25", "backend.gpu_memory_fraction=0.2"])
    assert (cfg.backend.device, cfg.backend.gpus_per_host, cfg.backend.gpu_memory_fraction) == ("cuda", 0.25, 0.2)
    # on Ray, 'cuda' needs a reserved share; in-process it does not
    with pytest.raises(ConfigError, match=r"backend\.device"):
        validate_semantics(ExperimentConfig(backend=BackendConfig(kind="ray", device="cuda")))
    validate_semantics(ExperimentConfig(backend=BackendConfig(kind="local", device="cuda")))
    # a host trains on one GPU
    with pytest.raises(ConfigError, match=r"backend\.gpus_per_host"):
        load_config(None, ["backend.gpus_per_host=2"])
    with pytest.raises(ConfigError, match=r"backend\.device"):
        load_config(None, ["backend.device=tpu"])
    with pytest.raises(ConfigError, match=r"backend\.placement"):
        load_config(None, ["backend.placement=random"])
    assert dataclasses.replace(cfg.backend, placement="pack").placement == "pack"
