"""The ResNet family's side exit (FedHeN, paper 001): the simple model is an index subset of the complex one, built,
extracted, scattered and priced by the family's own machinery."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.model import ResNetConfig
from rayfl.models.elastic.cost import CostModel, saved_tensors
from rayfl.models.elastic.resnet import ElasticResNet, ResNetFamily, SideHead, grid_mean
from rayfl.models.elastic.spec import RandomSubset, SubModelSpec, first_k

TINY = (4, 8, 16, 32)


pytestmark = pytest.mark.usefixtures("private_cache_one_thread")


def side_family(**kw: object) -> ResNetFamily:
    cfg = {"widths": TINY, "norm": "gn", "side_exit": 2, **kw}
    return ResNetFamily(ResNetConfig(**cfg))  # type: ignore[arg-type]


def global_model(fam: ResNetFamily, seed: int = 0) -> ElasticResNet:
    torch.manual_seed(seed)
    model = fam.global_model()
    assert isinstance(model, ElasticResNet)
    with torch.no_grad():
        model.get_parameter("side.alpha").fill_(0.3)  # a mix that is not 1/2, so a misread share would show
    return model


def test_paper_sizes_simple_model_is_the_first_two_stages_plus_side_head() -> None:
    """Paper 001: the simple model (stages 1-2 of PreActResNet-18 + mixed pooling + linear head) has about 0.7 M
    parameters; here exactly: stem 1,728 + stage 1 147,712 + stage 2 525,568 + side head (1 + 2,048 x 10 + 10)."""
    fam = ResNetFamily(ResNetConfig(norm="gn", side_exit=2))
    simple = fam.space.num_params(fam.side_exit_units())
    gn_affine = 2 * (4 * 64 + 64 + 3 * 128)  # GroupNorm weight and bias before every conv of stages 1-2
    convs = 3 * 64 * 9 + 4 * 64 * 64 * 9 + 64 * 128 * 9 + 3 * 128 * 128 * 9 + 64 * 128
    assert simple == convs + gn_affine + 1 + 2048 * 10 + 10 == 695_371
    assert fam.space.num_params(fam.full_units) == 11_192_661  # ResNet-18 (GN) + the side head


def test_simple_submodel_is_an_index_subset_and_equals_the_side_exit() -> None:
    fam = side_family()
    g = global_model(fam)
    params = g.state_dict()
    sel = first_k(fam.side_exit_units())
    slices = fam.slices(sel)
    expected = {n for n in params if n.startswith(("conv1.", "layers.0.", "layers.1.", "side."))}
    assert set(slices) == expected  # stages 1-2, the stem and the side head; nothing after the exit
    for name, tslice in slices.items():  # whole tensors: the simple model is a subset of the complex model's tensors
        shape = params[name].shape
        assert all(i is None or np.array_equal(i, np.arange(shape[k])) for k, i in enumerate(tslice.index))
    simple = fam.extract(params, sel)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    g.eval()
    simple.eval()
    with torch.no_grad():
        side, main = g.forward_exits(x)
        assert torch.equal(simple(x), side)
        assert torch.equal(g(x), main)  # forward skips the side head but gives the same main logits
        assert len(simple.forward_exits(x)) == 1  # type: ignore[operator]
    values, out_slices = fam.scatter(simple, sel)
    assert set(values) == expected
    for name, value in values.items():
        assert torch.equal(value, params[name])
        assert all(
            (a is None and b is None) or np.array_equal(a, b)
            for a, b in zip(out_slices[name].index, slices[name].index, strict=True)
        )


def test_mixed_pooling_by_hand() -> None:
    """x[c, r, q] = 256 c + 16 r + q; 4x4 windows of a 16x16 map. Channel 0, window (0, 0): max 51, mean 25.5;
    channel 1, window (3, 3) (feature 1 x 16 + 3 x 4 + 3 = 31): max 511, mean 485.5. Share sigmoid(ln 3) = 3/4."""
    head = SideHead(channels=4, pool=4, num_classes=10)
    x = torch.arange(4 * 16 * 16, dtype=torch.float32).reshape(1, 4, 16, 16)
    lin = head.get_submodule("linear")
    assert isinstance(lin, nn.Linear) and lin.weight.shape == (10, 4 * 16)
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.zero_()
        lin.weight[0, 0] = 1.0
        lin.weight[1, 31] = 1.0
        head.get_parameter("alpha").fill_(0.0)
        half = head(x)
        head.get_parameter("alpha").fill_(float(np.log(3.0)))
        three_quarters = head(x)
    assert half[0, 0].item() == pytest.approx(0.5 * 51 + 0.5 * 25.5)
    assert half[0, 1].item() == pytest.approx(0.5 * 511 + 0.5 * 485.5)
    assert three_quarters[0, 0].item() == pytest.approx(0.75 * 51 + 0.25 * 25.5)
    assert three_quarters[0, 1].item() == pytest.approx(0.75 * 511 + 0.25 * 485.5)


def test_cost_model_prices_simple_and_complex_exactly() -> None:
    """Parameters, forward FLOPs and saved activations of both models (every exit's loss in one pass) equal direct
    measurement of the built models: the side head keeps only pooled values, so pieces add up exactly."""
    fam = side_family(scaler=False)
    cm = CostModel(fam, batch_size=3, optimizer="sgd", momentum=0.0, transient_factor=0.0)
    assert cm.max_check_error < 1e-9

    class AllExits(nn.Module):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack(self.model.forward_exits(x)).sum(0)  # type: ignore[operator]

    costs = cm.evaluate(np.array([fam.side_exit_units(), fam.full_units]))
    for i, units in enumerate((fam.side_exit_units(), fam.full_units)):
        model = fam.build(units)
        assert costs.params[i] == sum(p.numel() for p in model.parameters())
        measured = {}
        for batch in (1, 3):
            with torch.device("meta"):
                wrapped = AllExits(fam.build(units))
                wrapped.train()
                x = torch.randn(batch, 3, 32, 32)
            saved, _, flops = saved_tensors(wrapped, x)
            measured[batch] = (float(sum(t.numel() * t.element_size() for t in saved)), flops)
        assert costs.flops[i] == pytest.approx(measured[1][1], rel=1e-12)
        assert costs.peak_memory[i] == pytest.approx(2 * 4 * costs.params[i] + measured[3][0], rel=1e-4)
    assert costs.peak_memory[0] < costs.peak_memory[1] and costs.bytes_down[0] < costs.bytes_down[1]


def test_side_exit_validation() -> None:
    with pytest.raises(ValueError, match="side_exit"):
        side_family(side_exit=4)
    with pytest.raises(ValueError, match="side_pool"):
        side_family(side_pool=3)
    with pytest.raises(ValueError, match="side_exit"):
        ResNetFamily(ResNetConfig(widths=TINY)).side_exit_units()


def test_without_side_exit_the_model_is_unchanged() -> None:
    """No side exit: the same tensors, the same initial values, no ``deep`` dimension."""
    fam = ResNetFamily(ResNetConfig(widths=TINY))
    assert "deep" not in [d.name for d in fam.space.dims]
    assert not any(n.startswith("side.") for n in fam.global_model().state_dict())


# ------------------------------------------------------------------------------------- the main head's grid pooling
def test_grid_mean_by_hand() -> None:
    """x[c, r, q] = 16 c + 4 r + q on 4x4 maps, 2x2 windows: channel 0's cells are the means of {0, 1, 4, 5} = 2.5,
    {2, 3, 6, 7} = 4.5, {8, 9, 12, 13} = 10.5, {10, 11, 14, 15} = 12.5, channel 1's the same plus 16, channel-major;
    a pool of 1 is the global average pool, bit for bit."""
    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(1, 2, 4, 4)
    assert grid_mean(x, 2).tolist() == [[2.5, 4.5, 10.5, 12.5, 18.5, 20.5, 26.5, 28.5]]
    assert grid_mean(x, 4).tolist() == [list(range(32))]
    y = torch.randn(3, 5, 4, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(grid_mean(y, 1), y.mean(dim=(2, 3)))


def test_head_pool_default_leaves_the_model_unchanged_and_pools_a_grid_otherwise() -> None:
    """``head_pool: 1`` is the global pool (same tensors and initial values, same logits as before); ``head_pool: 4``
    on the 4x4 maps of the last stage feeds the linear layer every cell of every channel, so a sub-model of any
    widths still equals the global model with the elements it lacks set to 0 (the linear layer's columns follow
    their channel, 16 per channel)."""
    plain = ResNetFamily(ResNetConfig(widths=TINY, norm="none", scaler=False))
    torch.manual_seed(0)
    model = plain.global_model()
    assert model.get_submodule("linear").in_features == TINY[-1]
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    grid = ResNetFamily(ResNetConfig(widths=TINY, norm="none", scaler=False, head_pool=4))
    torch.manual_seed(0)
    g = grid.global_model().eval()
    assert g.get_submodule("linear").in_features == TINY[-1] * 16
    spec = SubModelSpec.uniform(grid.space, 0.5, RandomSubset(seed=2, keys=(3,)))
    sel = grid.select(spec)
    sub = grid.extract(g.state_dict(), sel).eval()
    masked = grid.global_model()
    slices = grid.slices(sel)
    with torch.no_grad():
        masked.load_state_dict(g.state_dict())
        for name, t in masked.state_dict().items():
            keep = torch.zeros(t.shape, dtype=torch.bool)
            keep[slices[name].torch_index(tuple(t.shape))] = True
            t.mul_(keep)
        masked.eval()
        torch.testing.assert_close(sub(x), masked(x), atol=1e-5, rtol=1e-5)
    kept = slices["linear.weight"].index[1]
    assert kept is not None and len(kept) == 16 * TINY[-1] // 2
    channels = np.asarray(kept[::16]) // 16  # a kept channel brings its 16 cells, in order
    assert np.array_equal(np.asarray(kept).reshape(-1, 16), channels[:, None] * 16 + np.arange(16))
    assert not np.array_equal(channels, np.arange(TINY[-1] // 2))  # a random subset, not the first half
    with pytest.raises(ValueError, match="head_pool"):
        ResNetFamily(ResNetConfig(widths=TINY, head_pool=3))


def test_cost_model_prices_a_grid_head_exactly() -> None:
    """The grid head keeps no more for backward than the global pool did: costs equal direct measurement."""
    fam = ResNetFamily(ResNetConfig(widths=TINY, norm="gn", scaler=False, head_pool=2))
    cm = CostModel(fam, batch_size=3, optimizer="sgd", momentum=0.0, transient_factor=0.0)
    assert cm.max_check_error < 1e-9
    units = fam.full_units
    costs = cm.evaluate(np.array([units]))
    model = fam.build(units)
    assert costs.params[0] == sum(p.numel() for p in model.parameters())
    measured = {}
    for batch in (1, 3):
        with torch.device("meta"):
            built = fam.build(units)
            built.train()
            x = torch.randn(batch, 3, 32, 32)
        saved, _, flops = saved_tensors(built, x)
        measured[batch] = (float(sum(t.numel() * t.element_size() for t in saved)), flops)
    assert costs.flops[0] == pytest.approx(measured[1][1], rel=1e-12)
    assert costs.peak_memory[0] == pytest.approx(2 * 4 * costs.params[0] + measured[3][0], rel=1e-4)
