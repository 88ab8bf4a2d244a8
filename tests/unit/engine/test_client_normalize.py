"""data.normalize=client: each client's images reach its model with zero mean and unit variance per channel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rayfl.config.sections import DataConfig
from rayfl.engine.build import build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.exec.host import ClientHost
from rayfl.models import InputSpec, to_input
from rayfl.models.inputs import client_spec
from tests.helpers import tiny_config, tiny_image_dataset


def test_client_spec_gives_each_channel_zero_mean_and_unit_variance() -> None:
    rng = np.random.default_rng(0)
    x = np.clip(rng.normal([[[40.0]], [[128.0]], [[200.0]]], 20.0, size=(30, 3, 8, 8)), 0, 255).astype(np.uint8)
    spec = InputSpec("image", 4, (3, 8, 8), mean=(0.5,) * 3, std=(0.25,) * 3)
    out = to_input(x, client_spec(spec, x)).double()
    assert out.mean(dim=(0, 2, 3)).abs().max() < 1e-5
    assert (out.std(dim=(0, 2, 3), unbiased=False) - 1).abs().max() < 1e-4


def test_tokens_are_left_alone() -> None:
    spec = InputSpec("tokens", 80, (10,))
    assert client_spec(spec, np.zeros((4, 10), dtype=np.uint8)) is spec


def test_hosts_use_each_clients_own_statistics_only_when_asked() -> None:
    base = tiny_config(kind="local")
    for mode in ("dataset", "client"):
        cfg = dataclasses.replace(base, data=DataConfig(normalize=mode))  # type: ignore[arg-type]
        setup = build_setup(cfg, tiny_image_dataset())
        host = ClientHost(0, setup.dataset, cfg.model, setup.algorithm, cfg.backend, 0)
        x0, _ = setup.dataset.client_train(0)
        x1, _ = setup.dataset.client_train(1)
        s0, s1 = host._spec_of(0, x0), host._spec_of(1, x1)
        if mode == "dataset":
            assert s0 is s1 is host.input_spec
        else:
            assert s0.mean != s1.mean and s0 == client_spec(host.input_spec, x0)
            assert host._spec_of(0, x0) is s0  # computed once per client


def test_a_run_with_client_normalisation_trains_and_differs_from_dataset_statistics() -> None:
    base = tiny_config(kind="local")
    results = {}
    for mode in ("dataset", "client"):
        cfg = dataclasses.replace(base, data=DataConfig(normalize=mode))  # type: ignore[arg-type]
        results[mode] = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    client, dataset = results["client"].records[-1], results["dataset"].records[-1]
    assert np.isfinite(client.train_loss) and client.clients_failed == 0
    assert client.train_loss != pytest.approx(dataset.train_loss, rel=1e-9)
