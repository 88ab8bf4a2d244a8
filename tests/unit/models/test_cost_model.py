"""The cost model against direct measurement of whole sub-models on the meta device."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rayfl.config.model import CNNConfig, ResNetConfig
from rayfl.models.elastic import cost
from rayfl.models.elastic.convnets import HeteroCNNFamily
from rayfl.models.elastic.cost import CostModel, optimizer_slots, saved_tensors, units_from_ratios
from rayfl.models.elastic.resnet import ResNetFamily

RATIOS = np.array([0.0, 0.0625, 0.25, 0.5, 1.0])


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path))


def random_units(fam: ResNetFamily, rng: np.random.Generator, n: int) -> np.ndarray:
    space = fam.space
    ratios = rng.choice(RATIOS[1:], size=(n, len(space.dims)))
    skip = (rng.random((n, len(space.dims))) < 0.3) & space.skippable
    ratios[skip] = 0.0
    return units_from_ratios(ratios, space.sizes, space.skippable)


def whole_model(fam: ResNetFamily, units: np.ndarray, batch: int) -> tuple[float, float]:
    """(saved bytes, forward FLOPs) of the built sub-model, measured directly."""
    with torch.device("meta"):
        model = fam.build(tuple(int(u) for u in units))
        model.train()
        x = torch.randn(batch, 3, 32, 32)
    saved, _, flops = saved_tensors(model, x)
    return float(sum(t.numel() * t.element_size() for t in saved)), flops


@pytest.mark.parametrize(
    "cfg",
    [
        ResNetConfig(depth=18, widths=(8, 16, 32, 64)),
        ResNetConfig(depth=50, widths=(8, 16, 32, 64), norm="gn", act="relu6"),
        ResNetConfig(depth=34, widths=(8, 16, 32, 64), norm="none", scaler=False),
    ],
    ids=["r18-bn", "r50-gn", "r34-none"],
)
def test_vectorised_costs_equal_direct_measurement(cfg: ResNetConfig) -> None:
    fam = ResNetFamily(cfg)
    cm = CostModel(fam, batch_size=3, optimizer="sgd", momentum=0.0, transient_factor=0.0)
    assert cm.max_check_error < 1e-9
    units = random_units(fam, np.random.default_rng(0), 6)
    units[0] = fam.full_units
    costs = cm.evaluate(units)
    for i, u in enumerate(units):
        assert costs.params[i] == fam.space.num_params(tuple(int(v) for v in u))
        model = fam.build(tuple(int(v) for v in u))
        assert costs.params[i] == sum(p.numel() for p in model.parameters())
        saved3, flops1 = whole_model(fam, u, 3)[0], whole_model(fam, u, 1)[1]
        assert costs.flops[i] == pytest.approx(flops1, rel=1e-12)
        # SGD without momentum, no transient: memory = 2 x parameter bytes + saved tensors at batch 3. Exact, except
        # that GroupNorm with gcd(groups, width) groups saves 8 bytes per group and sample: not multilinear in width.
        tol = 1e-4 if cfg.norm == "gn" else 1e-12
        assert costs.peak_memory[i] == pytest.approx(2 * 4 * costs.params[i] + saved3, rel=tol)
        assert costs.bytes_down[i] == costs.bytes_up[i] == 4 * costs.params[i]


def test_skipping_a_block_and_narrowing_reduce_every_cost() -> None:
    fam = ResNetFamily(ResNetConfig(depth=18, widths=(8, 16, 32, 64)))
    cm = CostModel(fam, batch_size=8)
    full = np.array(fam.full_units)
    skipped = full.copy()
    skipped[np.flatnonzero(fam.space.skippable)[0]] = 0
    half = units_from_ratios(np.full((1, len(full)), 0.5), fam.space.sizes, fam.space.skippable)[0]
    c = cm.evaluate(np.stack([full, skipped, half]))
    for field in ("params", "flops", "peak_memory", "bytes_down"):
        values = getattr(c, field)
        assert values[1] < values[0] and values[2] < values[0], field


def test_optimizer_state_overhead_and_compression() -> None:
    fam = ResNetFamily(ResNetConfig(depth=18, widths=(8, 16, 32, 64)))
    u = np.array(fam.full_units)
    base = CostModel(fam, batch_size=4, optimizer="sgd", momentum=0.0).model_cost(u)
    adam = CostModel(fam, batch_size=4, optimizer="adam").model_cost(u)
    over = CostModel(fam, batch_size=4, optimizer="sgd", momentum=0.0, overhead_bytes=1e6).model_cost(u)
    half = CostModel(fam, batch_size=4, upload_compression=0.25).model_cost(u)
    assert adam["peak_memory"] - base["peak_memory"] == pytest.approx(2 * 4 * base["params"])
    assert over["peak_memory"] - base["peak_memory"] == pytest.approx(1e6)
    assert half["bytes_up"] == pytest.approx(0.25 * half["bytes_down"])
    assert optimizer_slots("sgd", 0.9) == 1 and optimizer_slots("adamw") == 2
    with pytest.raises(ValueError, match="optimizer"):
        optimizer_slots("lbfgs")


def test_batch_memory_grows_linearly_and_fits_are_cached_on_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cost, "_FITS", {})  # start from an empty in-process table so the fit is measured and stored
    fam = ResNetFamily(ResNetConfig(depth=18, widths=(8, 16, 32, 64)))
    u = np.array(fam.full_units)
    m8 = CostModel(fam, batch_size=8).model_cost(u)["peak_memory"]
    m16 = CostModel(fam, batch_size=16).model_cost(u)["peak_memory"]
    m24 = CostModel(fam, batch_size=24).model_cost(u)["peak_memory"]
    assert m16 - m8 == pytest.approx(m24 - m16)
    assert list((tmp_path / "cost").glob("fits-*.json"))
    stored = cost._load_disk()
    assert stored.keys() == cost._FITS.keys()
    for kid, fit in stored.items():
        np.testing.assert_array_equal(fit.saved_per_sample, cost._FITS[kid].saved_per_sample)


@pytest.mark.parametrize(
    "damage",
    [
        "{not json",
        "[]",
        "null",
        '{"k": 1}',
        '{"k": {"flops": [1.0]}}',  # fields missing
        '{"k": {"flops": [1, 2, 3], "saved_per_sample": [1, 2, 3], "saved_fixed": [1, 2, 3], "tensors": [], "err": 0}}',
        '{"k": {"flops": "ab", "saved_per_sample": [1], "saved_fixed": [1], "tensors": [], "err": 0}}',
        '{"k": {"flops": [1, 2], "saved_per_sample": [1], "saved_fixed": [1, 2], "tensors": [], "err": 0}}',
        '{"k": {"flops": [1, 2], "saved_per_sample": [1, 2], "saved_fixed": [1, 2], "tensors": [[1]], "err": 0}}',
        '{"k": {"flops": [1, 2], "saved_per_sample": [1, 2], "saved_fixed": [1, 2], "tensors": [], "err": "x"}}',
        "wrong size",  # valid fits, each under another piece's key (the monomial counts no longer match)
    ],
)
def test_a_damaged_disk_cache_is_ignored_with_a_warning_and_measured_again(
    damage: str, tmp_path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    fam = HeteroCNNFamily(CNNConfig(channels=(4, 8)), image_size=8)
    units = np.array(fam.full_units)
    monkeypatch.setattr(cost, "_FITS", {})
    want = CostModel(fam, batch_size=4).model_cost(units)
    (cache,) = (tmp_path / "cost").glob("fits-*.json")
    good = json.loads(cache.read_text())
    swapped = damage == "wrong size"
    if swapped:
        by_size = sorted(good, key=lambda k: len(good[k]["flops"]))
        assert len(good[by_size[0]]["flops"]) != len(good[by_size[-1]]["flops"])
        damage = json.dumps({k: good[other] for k, other in zip(by_size, reversed(by_size), strict=True)})
    cache.write_text(damage)
    monkeypatch.setattr(cost, "_FITS", {})
    with caplog.at_level("WARNING", logger="rayfl.models.elastic.cost"):
        got = CostModel(fam, batch_size=4).model_cost(units)
    assert got == want
    said = "has the wrong shape: measuring it again" if swapped else "measuring again"
    assert "cost model cache" in caplog.text and said in caplog.text, caplog.text
    assert json.loads(cache.read_text()).keys() == good.keys()  # rewritten whole


def test_ratio_validation() -> None:
    fam = ResNetFamily(ResNetConfig(depth=18, widths=(8, 16, 32, 64)))
    cm = CostModel(fam, batch_size=2)
    bad = np.ones((1, len(fam.space.dims)))
    bad[0, int(np.flatnonzero(~fam.space.skippable)[0])] = 0.0
    with pytest.raises(ValueError, match="skippable"):
        cm.evaluate_ratios(bad)
    with pytest.raises(ValueError, match="unit counts"):
        cm.evaluate(np.ones((2, 3)))
