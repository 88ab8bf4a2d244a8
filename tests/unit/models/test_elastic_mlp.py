"""The elastic MLP (``model.name: mlp``, issue 44): layouts, sub-models against the masked global model, removed
residual blocks, every selector's extract/scatter, cost pieces against the whole model, static BN on one sample."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.model import CNNConfig, MLPConfig
from rayfl.fl.common.search import named_structure
from rayfl.fl.methods.heterofl.algorithm import static_bn_statistics, tracked_global_model
from rayfl.models.elastic.cost import CostModel, saved_tensors
from rayfl.models.elastic.mlp import MLPFamily
from rayfl.models.elastic.spec import FirstK, RandomSubset, Rolling, SubModelSpec, TopKNorm
from rayfl.models.families import build_family
from rayfl.models.inputs import InputSpec

SELECTORS = [FirstK(), Rolling(5), RandomSubset(seed=1, keys=(7,)), TopKNorm()]
SELECTOR_IDS = ["firstk", "rolling", "random", "topk"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path))


def mlp(sample: tuple[int, ...] = (16,), **kw: object) -> MLPFamily:
    return MLPFamily(MLPConfig(**{"hidden": (12, 8, 10), **kw}), sample, 5)  # type: ignore[arg-type]


FAMILIES: dict[str, Callable[[], MLPFamily]] = {
    "plain": lambda: mlp(scaler=False),
    "plain-batch": lambda: mlp(norm="batch"),
    "plain-layer-dropout": lambda: mlp(norm="layer", dropout=0.2, act="gelu"),
    "images": lambda: mlp((1, 4, 4), act="relu6"),
    "residual": lambda: mlp(residual=True, scaler=False),
    "residual-batch": lambda: mlp(residual=True, norm="batch", act="gelu", dropout=0.1),
}


@pytest.fixture(params=list(FAMILIES), ids=list(FAMILIES))
def fam(request: pytest.FixtureRequest) -> MLPFamily:
    return FAMILIES[request.param]()


def inputs(fam: MLPFamily, batch: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randn((batch, *fam.sample_shape), generator=torch.Generator().manual_seed(seed))


def global_state(fam: MLPFamily, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = fam.global_model()
    with torch.no_grad():  # non-trivial norm parameters and biases, so selections that drop them would show
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def mixed(fam: MLPFamily, selector: FirstK | Rolling | RandomSubset | TopKNorm | None = None) -> SubModelSpec:
    """Different ratios per dimension; a residual model's first block removed."""
    ratios = (0.5, 0.0, 0.75) if fam.cfg.residual else (0.5, 0.25, 0.75)
    return SubModelSpec(ratios, selector or FirstK())


def test_the_default_is_mcmahans_2nn() -> None:
    """FedAvg's MNIST 2NN: 784 → 200 → 200 → 10 with ReLU, 199,210 parameters (McMahan et al. 2017, Sec. 3)."""
    fam = MLPFamily(MLPConfig(), (1, 28, 28), 10)
    assert fam.space.num_params(fam.full_units) == 199_210
    assert sum(p.numel() for p in fam.global_model().parameters()) == 199_210


def test_every_state_dict_entry_has_a_layout(fam: MLPFamily) -> None:
    for spec in (SubModelSpec.uniform(fam.space, 1.0), mixed(fam), SubModelSpec.uniform(fam.space, 0.1)):
        units = fam.space.units(spec.ratios)
        state = fam.build(units).state_dict()
        assert set(state) == {n for n in fam.space.layouts if fam.space.present(n, units)}
        for name, value in state.items():
            assert tuple(value.shape) == fam.space.sub_shape(name, units), name


def test_the_family_of_a_feature_input_and_the_refusals_of_other_kinds() -> None:
    spec = InputSpec("features", 3, (16,))
    assert isinstance(build_family(MLPConfig(hidden=(8,)), spec), MLPFamily)
    with pytest.raises(ValueError, match=r"model.name='cnn' needs image inputs, but the data gives feature vectors of "
                       r"16 values: set model.name=mlp \(or data.input_shape to \[C, H, W\]"):  # fmt: skip
        build_family(CNNConfig(), spec)
    with pytest.raises(ValueError, match=r"model.name='mlp' needs feature vectors \(or images\), but the data gives "
                       r"tokens"):  # fmt: skip
        build_family(MLPConfig(), InputSpec("tokens", 30, (8,)))


# ------------------------------------------------------------------------------------------- sub-model outputs
@pytest.mark.parametrize("selector", [FirstK(), Rolling(5), RandomSubset(seed=1, keys=(7,))], ids=SELECTOR_IDS[:3])
@pytest.mark.parametrize("which", ["plain", "images", "residual"])
def test_sub_model_equals_masked_global(which: str, selector: FirstK | Rolling | RandomSubset) -> None:
    """A dropped unit, zeroed in the global model's tensors that write it, is 0 after its activation (ReLU and ReLU6
    of 0 are 0), so it adds nothing downstream; a removed block's zeroed branch adds nothing to the stream. Eval mode
    where the scaler is on (it divides only in training)."""
    fam = FAMILIES[which]()
    params = global_state(fam, seed=3)
    sel = fam.select(mixed(fam, selector))
    sub = fam.extract(params, sel)
    masked = {k: v.clone() for k, v in params.items()}
    for name, lay in fam.space.layouts.items():
        if lay.gate is not None and sel.units[lay.gate] == 0:
            masked[name].zero_()  # the removed block's tensors
            continue
        ax = lay.axes[0]
        if ax is not None:
            keep = torch.zeros(lay.shape[0], dtype=torch.bool)
            keep[torch.as_tensor(sel.index[ax.dim])] = True
            masked[name][~keep] = 0.0
    reference = fam.global_model()
    reference.load_state_dict(masked)
    x = inputs(fam, seed=1)
    for train in (False, True) if not fam.cfg.scaler else (False,):
        with torch.no_grad():
            torch.testing.assert_close(sub.train(train)(x), reference.train(train)(x), rtol=1e-5, atol=1e-6)


def test_a_removed_block_is_the_identity() -> None:
    fam = FAMILIES["residual"]()
    params = global_state(fam)
    units = (12, 0, 10)
    sub = fam.extract(params, fam.select(SubModelSpec((1.0, 0.0, 1.0))))
    assert not any(name.startswith("blocks.0.") for name in sub.state_dict())
    cut = dict(params) | {k: torch.zeros_like(v) for k, v in params.items() if k.startswith("blocks.0.fc2.")}
    reference = fam.global_model()
    reference.load_state_dict(cut)
    x = inputs(fam)
    with torch.no_grad():
        assert torch.equal(sub.eval()(x), reference.eval()(x))
    assert fam.space.skippable.tolist() == [False, True, True]
    assert named_structure(fam, 1.0, [1]) == (12, 8, 0) and fam.space.units((1.0, 0.0, 1.0)) == units


@pytest.mark.parametrize("selector", SELECTORS, ids=SELECTOR_IDS)
def test_extract_scatter_round_trip(fam: MLPFamily, selector: FirstK | Rolling | RandomSubset | TopKNorm) -> None:
    params = global_state(fam)
    sel = fam.select(mixed(fam, selector), params)
    sub = fam.extract(params, sel)
    values, slices = fam.scatter(sub, sel)
    assert set(values) == set(slices) == set(sub.state_dict())
    for name, value in values.items():
        assert torch.equal(params[name][slices[name].torch_index(tuple(params[name].shape))], value), name


def test_topk_keeps_the_largest_norm_units() -> None:
    fam = FAMILIES["plain"]()
    params = global_state(fam)
    params["layers.1.weight"][6] *= 100.0
    sel = fam.select(SubModelSpec.uniform(fam.space, 0.125, TopKNorm()), params)
    assert sel.index[1].tolist() == [6]


def test_every_sub_model_trains_one_step(fam: MLPFamily) -> None:
    for spec in (SubModelSpec.uniform(fam.space, 1.0), mixed(fam)):
        model = fam.extract(global_state(fam), fam.select(spec)).train()
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        loss = nn.functional.cross_entropy(model(inputs(fam)), torch.tensor([0, 1, 2, 3, 4, 0]))
        loss.backward()  # type: ignore[no-untyped-call]
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        assert torch.isfinite(loss)
        assert all(not torch.equal(before[k], v) for k, v in model.named_parameters() if v.ndim == 2)


# ------------------------------------------------------------------------------------------- batch norm
def test_static_batch_norm_normalises_a_batch_of_one_and_gives_heterofls_tracked_copy() -> None:
    """A client's last batch may hold one sample: normalised with its own statistics (as two copies of it would be),
    where torch refuses one value per channel; the server's static-BN copy tracks statistics of feature vectors."""
    fam = FAMILIES["plain-batch"]()
    model = fam.global_model().train()
    x = inputs(fam, batch=1)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(torch.cat([x, x]))[:1])
    tracked = tracked_global_model(fam)
    assert tracked is not None
    tracked.load_state_dict(global_state(fam), strict=False)
    rows = inputs(fam, batch=40).numpy()
    stats = static_bn_statistics(tracked, rows, InputSpec("features", 5, (16,)), batch_size=10)
    assert set(stats) == {f"norms.{k}.{s}" for k in range(3) for s in ("running_mean", "running_var")}
    assert all(bool(torch.isfinite(v).all()) for v in stats.values())


# ------------------------------------------------------------------------------------------- cost pieces
def _saved_bytes(module: nn.Module, x: torch.Tensor) -> tuple[int, float]:
    module.train()
    saved, _, flops = saved_tensors(module, x)
    return sum(t.numel() * t.element_size() for t in saved), flops


@pytest.mark.parametrize("ratio", [1.0, 0.5, None], ids=["full", "half", "mixed"])
def test_pieces_saved_bytes_sum_to_the_whole_model(fam: MLPFamily, ratio: float | None) -> None:
    spec = mixed(fam) if ratio is None else SubModelSpec.uniform(fam.space, ratio)
    units = fam.space.units(spec.ratios)
    batch = 3
    with torch.device("meta"):
        whole, x = fam.build(units), torch.empty(batch, *fam.sample_shape)
    whole_bytes, whole_flops = _saved_bytes(whole, x)
    piece_bytes, piece_flops = 0, 0.0
    for unit in fam.cost_units():
        if unit.gate is not None and units[unit.gate] == 0:
            continue
        with torch.device("meta"):
            module, make_input = unit.make(tuple(units[d] for d in unit.dims))
            xin = make_input(batch, torch.device("meta"))
        b, f = _saved_bytes(module, xin)
        piece_bytes += b
        piece_flops += f
    assert piece_bytes == whole_bytes
    assert piece_flops == whole_flops


@pytest.mark.parametrize("which", ["plain", "plain-batch", "residual-batch", "images"])
def test_cost_model_matches_direct_measurement(which: str) -> None:
    """Batch-norm pieces refuse a batch of one: their fits come from batches of 2 and 3, as exact."""
    fam = FAMILIES[which]()
    cm = CostModel(fam, batch_size=3, optimizer="sgd", momentum=0.0, transient_factor=0.0, use_disk_cache=False)
    assert cm.max_check_error < 1e-9
    specs = [SubModelSpec.uniform(fam.space, 1.0), mixed(fam), SubModelSpec.uniform(fam.space, 0.1)]
    units = np.array([fam.space.units(s.ratios) for s in specs])
    costs = cm.evaluate(units)
    for i, u in enumerate(units):
        u_t = tuple(int(v) for v in u)
        with torch.device("meta"):
            model, x = fam.build(u_t), torch.empty(3, *fam.sample_shape)
        saved, flops = _saved_bytes(model, x)
        assert costs.params[i] == sum(p.numel() for p in fam.build(u_t).parameters())
        assert costs.peak_memory[i] == pytest.approx(2 * 4 * costs.params[i] + saved, rel=1e-12)
        assert flops > 0 and costs.flops[i] == pytest.approx(flops / 3, rel=1e-12)
