"""Elastic HeteroFL conv net and LEAF FEMNIST CNN: layouts, selectors, extract/scatter, training, cost pieces."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.model import CNNConfig, FemnistCNNConfig
from rayfl.models.elastic.convnets import FemnistCNNFamily, HeteroCNNFamily
from rayfl.models.elastic.cost import CostModel, saved_tensors
from rayfl.models.elastic.family import ElasticFamily
from rayfl.models.elastic.spec import FirstK, RandomSubset, Rolling, Selection, SubModelSpec, TopKNorm

SMALL_CNN = (8, 16, 32, 64)  # fast stand-in for HeteroFL's (64, 128, 256, 512)
SELECTORS = [FirstK(), Rolling(5), RandomSubset(seed=1, keys=(7,)), TopKNorm()]
SELECTOR_IDS = ["firstk", "rolling", "random", "topk"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path))


Norm = Literal["batch", "group", "none"]


def hetero(norm: Norm = "batch", scaler: bool = True, channels: tuple[int, ...] = SMALL_CNN) -> HeteroCNNFamily:
    return HeteroCNNFamily(CNNConfig(channels=channels, norm=norm), in_channels=3, num_classes=10, scaler=scaler)


def femnist(scaler: bool = False, hidden: int = 96) -> FemnistCNNFamily:
    return FemnistCNNFamily(FemnistCNNConfig(hidden=hidden), in_channels=1, num_classes=62, scaler=scaler)


def image_shape(fam: ElasticFamily, batch: int) -> tuple[int, int, int, int]:
    assert isinstance(fam, (HeteroCNNFamily, FemnistCNNFamily))
    return (batch, fam.in_channels, fam.image_size, fam.image_size)


def images(fam: ElasticFamily, batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(image_shape(fam, batch), generator=torch.Generator().manual_seed(seed))


def global_state(fam: ElasticFamily, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = fam.global_model()
    with torch.no_grad():  # non-trivial norm affine parameters, so selections that drop them would show
        for name, p in model.named_parameters():
            if p.ndim == 1 and name not in fam.space.classifier:
                p.add_(0.1 * torch.randn_like(p))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def mixed_spec(fam: ElasticFamily, selector: FirstK | Rolling | RandomSubset | TopKNorm | None = None) -> SubModelSpec:
    """Different ratios per dimension (one of them 1.0 when there are five or more)."""
    ratios = (0.5, 0.25, 0.75, 0.3, 1.0)
    return SubModelSpec(tuple(ratios[i % len(ratios)] for i in range(len(fam.space.dims))), selector or FirstK())


FAMILIES: dict[str, Callable[[], ElasticFamily]] = {
    "hetero-bn": lambda: hetero("batch"),
    "hetero-gn": lambda: hetero("group"),
    "hetero-none": lambda: hetero("none", scaler=False),
    "femnist": lambda: femnist(),
    "femnist-scaler": lambda: femnist(scaler=True),
}


@pytest.fixture(params=list(FAMILIES), ids=list(FAMILIES))
def fam(request: pytest.FixtureRequest) -> ElasticFamily:
    return FAMILIES[request.param]()


# ------------------------------------------------------------------------------------------- parameter counts
def test_hetero_default_parameter_count() -> None:
    # conv: 3*64*9+64 + 64*128*9+128 + 128*256*9+256 + 256*512*9+512; BN: 2*(64+128+256+512); linear: 512*10+10
    assert hetero("batch", channels=(64, 128, 256, 512)).space.num_params((64, 128, 256, 512)) == 1_558_026
    assert hetero("none", channels=(64, 128, 256, 512)).space.num_params((64, 128, 256, 512)) == 1_556_106


def test_femnist_parameter_count_is_leafs() -> None:
    fam = FemnistCNNFamily(FemnistCNNConfig(), in_channels=1, num_classes=62, image_size=28)
    model = fam.global_model()
    assert sum(p.numel() for p in model.parameters()) == 6_603_710
    assert fam.space.num_params(fam.full_units) == 6_603_710
    assert tuple(model.state_dict()["fc1.weight"].shape) == (2048, 64 * 7 * 7)


def test_every_state_dict_entry_has_a_layout(fam: ElasticFamily) -> None:
    for spec in (SubModelSpec.uniform(fam.space, 1.0), mixed_spec(fam), SubModelSpec.uniform(fam.space, 0.0625)):
        units = fam.space.units(spec.ratios)
        state = fam.build(units).state_dict()
        assert set(state) == set(fam.space.layouts)
        for name, value in state.items():
            assert tuple(value.shape) == fam.space.sub_shape(name, units), name


# ------------------------------------------------------------------------------------------- sub-model outputs
def test_all_ones_spec_reproduces_the_global_model(fam: ElasticFamily) -> None:
    params = global_state(fam)
    full = fam.global_model()
    full.load_state_dict(params)
    sub = fam.extract(params, fam.select(SubModelSpec.uniform(fam.space, 1.0)))
    x = images(fam)
    with torch.no_grad():
        assert torch.equal(sub.eval()(x), full.eval()(x))


def masked_global(fam: ElasticFamily, params: dict[str, torch.Tensor], sel: Selection) -> nn.Module:
    """The global model with every unit the selection drops zeroed in the tensors that write it (axis 0)."""
    masked = {k: v.clone() for k, v in params.items()}
    for name, lay in fam.space.layouts.items():
        ax = lay.axes[0]
        if ax is None:
            continue
        keep = torch.zeros(lay.shape[0], dtype=torch.bool)
        keep[torch.as_tensor(sel.index[ax.dim]).repeat_interleave(ax.group)] = True
        masked[name][~keep] = 0.0
    model = fam.global_model()
    model.load_state_dict(masked)
    return model


@pytest.mark.parametrize("selector", [FirstK(), Rolling(5), RandomSubset(seed=1, keys=(7,))], ids=SELECTOR_IDS[:3])
@pytest.mark.parametrize("which", ["hetero-none", "hetero-bn", "femnist", "femnist-scaler"])
def test_sub_model_equals_masked_global(which: str, selector: FirstK | Rolling | RandomSubset) -> None:
    """A dropped unit, zeroed in the global model, outputs exactly 0 after its ReLU, so it adds nothing downstream.

    Valid configs: ReLU after every hidden layer, and norms that act per channel. norm "none" is exact; static BN
    (batch statistics, per channel) is too once the dropped channel's gamma and beta are zeroed (its output is then
    beta = 0). GroupNorm is not comparable: a group's statistics mix channels and the sub-model has fewer channels per
    group. The scaler divides by the width rate in training only, so the comparison is in eval mode; "hetero-none" has
    the scaler off and so also matches in training mode. The non-first-k selectors check that the scattered columns of
    FEMNIST's fc1 (49 per conv2 channel) line up with the channels that are kept.
    """
    fam = FAMILIES[which]()
    params = global_state(fam, seed=3)
    sel = fam.select(mixed_spec(fam, selector))
    assert any(u < d.size for u, d in zip(sel.units, fam.space.dims, strict=True))
    sub = fam.extract(params, sel)
    reference = masked_global(fam, params, sel)
    x = images(fam, seed=1)
    modes = (False, True) if which == "hetero-none" else (False,)
    for train in modes:
        with torch.no_grad():
            torch.testing.assert_close(sub.train(train)(x), reference.train(train)(x), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------- extract / scatter
@pytest.mark.parametrize("selector", SELECTORS, ids=SELECTOR_IDS)
def test_extract_scatter_round_trip(fam: ElasticFamily, selector: FirstK | Rolling | RandomSubset | TopKNorm) -> None:
    params = global_state(fam)
    spec = mixed_spec(fam, selector)
    sel = fam.select(spec, params)
    assert sel.units == fam.space.units(spec.ratios)
    sub = fam.extract(params, sel)
    values, slices = fam.scatter(sub, sel)
    assert set(values) == set(slices) == set(fam.space.layouts)
    sub_state = sub.state_dict()
    for name, value in values.items():
        assert torch.equal(value, sub_state[name])
        assert torch.equal(params[name][slices[name].torch_index(tuple(params[name].shape))], value), name


def test_topk_keeps_the_largest_norm_channels() -> None:
    fam = femnist()
    params = global_state(fam)
    params["conv2.weight"][5] *= 100.0
    params["fc1.weight"][17] *= 100.0
    sel = fam.select(SubModelSpec.uniform(fam.space, 0.0625, TopKNorm()), params)
    assert 5 in sel.index[1] and 17 in sel.index[2]


@pytest.mark.parametrize("which", ["hetero", "femnist"])
def test_rolling_and_random_cover_every_channel(which: str) -> None:
    """Over enough rounds every unit of every dimension is trained. Random subsets (drawn independently per dimension)
    also cover every element of every tensor; rolling windows do not have to: they share one start per round, so for a
    conv with 16 outputs and 8 inputs at ratio 0.25 the windows (r mod 16 ..) x (r mod 8 ..) never pair output 0 with
    input 4 (FedRolex's behaviour)."""
    fam: ElasticFamily = hetero() if which == "hetero" else femnist()
    params = global_state(fam)
    widest = max(d.size for d in fam.space.dims)  # a rolling window visits every start of every dimension once
    # random at ratio 0.5: an element of a 2-D tensor is kept with probability 1/4 a round; missed in 100 rounds: 3e-13
    for name_, make, ratio, rounds in (
        ("rolling", lambda r: Rolling(r), 0.25, widest),
        ("random", lambda r: RandomSubset(seed=1, keys=(r,)), 0.5, 100),
    ):
        seen = [np.zeros(d.size, dtype=bool) for d in fam.space.dims]
        covered = {k: torch.zeros_like(v, dtype=torch.bool) for k, v in params.items()}
        for r in range(rounds):
            sel = fam.select(SubModelSpec.uniform(fam.space, ratio, make(r)))
            assert sel.units == fam.space.units((ratio,) * len(fam.space.dims))
            for d, idx in enumerate(sel.index):
                seen[d][idx] = True
            if name_ == "random":
                for name, tslice in fam.slices(sel).items():
                    covered[name][tslice.torch_index(tuple(params[name].shape))] = True
        assert all(bool(s.all()) for s in seen), name_
        if name_ == "random":
            assert all(bool(c.all()) for c in covered.values())


def test_scatter_with_rows_returns_only_those_classes(fam: ElasticFamily) -> None:
    params = global_state(fam)
    sel = fam.select(mixed_spec(fam, Rolling(3)))
    sub = fam.extract(params, sel)
    rows = np.array([1, 4, 7])
    values, slices = fam.scatter(sub, sel, rows=rows)
    full_values, _ = fam.scatter(sub, sel)
    for name in fam.space.layouts:
        if name in fam.space.classifier:
            assert values[name].shape[0] == 3
            np.testing.assert_array_equal(slices[name].index[0], rows)
            assert torch.equal(values[name], full_values[name][rows])
            assert torch.equal(params[name][slices[name].torch_index(tuple(params[name].shape))], values[name])
        else:
            assert torch.equal(values[name], full_values[name])


# ------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("ratio", [0.0625, 1.0])
@pytest.mark.parametrize(
    "which", ["hetero-bn", "hetero-gn", "hetero-none", "femnist", "femnist-scaler", "hetero-default", "femnist-default"]
)
def test_builds_and_trains_one_step(which: str, ratio: float) -> None:
    if which == "hetero-default":
        fam: ElasticFamily = HeteroCNNFamily(CNNConfig(norm="batch"))
    elif which == "femnist-default":
        fam = FemnistCNNFamily(FemnistCNNConfig())
    else:
        fam = FAMILIES[which]()
    params = global_state(fam)
    sel = fam.select(SubModelSpec.uniform(fam.space, ratio))
    model = fam.extract(params, sel).train()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = images(fam, batch=4)
    y = torch.tensor([0, 1, 2, 3])
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    assert torch.isfinite(loss)
    after = dict(model.named_parameters())
    assert all(bool(torch.isfinite(p).all()) for p in after.values())
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    # every weight moves (biases may not: a conv bias right before a norm has a zero gradient)
    assert {k for k, v in before.items() if v.ndim >= 2} <= changed
    assert set(fam.space.classifier) <= changed


# ------------------------------------------------------------------------------------------- cost pieces
def _saved_bytes(module: nn.Module, x: torch.Tensor) -> tuple[int, float]:
    module.train()
    saved, _, flops = saved_tensors(module, x)
    return sum(t.numel() * t.element_size() for t in saved), flops


@pytest.mark.parametrize("ratio", [1.0, 0.5, None], ids=["full", "half", "mixed"])
def test_pieces_saved_bytes_sum_to_the_whole_model(fam: ElasticFamily, ratio: float | None) -> None:
    spec = mixed_spec(fam) if ratio is None else SubModelSpec.uniform(fam.space, ratio)
    units = fam.space.units(spec.ratios)
    batch = 3
    with torch.device("meta"):
        whole, x = fam.build(units), torch.empty(image_shape(fam, batch))
    whole_bytes, whole_flops = _saved_bytes(whole, x)
    piece_bytes, piece_flops = 0, 0.0
    for unit in fam.cost_units():
        with torch.device("meta"):
            module, make_input = unit.make(tuple(units[d] for d in unit.dims))
            xin = make_input(batch, torch.device("meta"))
        b, f = _saved_bytes(module, xin)
        piece_bytes += b
        piece_flops += f
    assert piece_bytes == whole_bytes
    assert piece_flops == whole_flops


@pytest.mark.parametrize("which", ["hetero-bn", "hetero-none", "femnist-scaler"])
def test_cost_model_matches_direct_measurement(which: str) -> None:
    fam = FAMILIES[which]()
    cm = CostModel(fam, batch_size=3, optimizer="sgd", momentum=0.0, transient_factor=0.0, use_disk_cache=False)
    assert cm.max_check_error < 1e-9
    specs = [SubModelSpec.uniform(fam.space, 1.0), mixed_spec(fam), SubModelSpec.uniform(fam.space, 0.0625)]
    units = np.array([fam.space.units(s.ratios) for s in specs])
    costs = cm.evaluate(units)
    for i, u in enumerate(units):
        u_t = tuple(int(v) for v in u)
        with torch.device("meta"):
            model, x = fam.build(u_t), torch.empty(image_shape(fam, 3))
        saved, _ = _saved_bytes(model, x)
        assert costs.params[i] == sum(p.numel() for p in fam.build(u_t).parameters())
        assert costs.peak_memory[i] == pytest.approx(2 * 4 * costs.params[i] + saved, rel=1e-12)
        with torch.device("meta"):
            model, x = fam.build(u_t), torch.empty(image_shape(fam, 1))
        flops = _saved_bytes(model, x)[1]
        assert flops > 0 and costs.flops[i] == pytest.approx(flops, rel=1e-12)
