"""Elastic pre-activation ResNet: exact sub-model semantics, residual alignment, selectors, extract/scatter, counts."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.model import ResNetConfig
from rayfl.core.messages import TensorSlice
from rayfl.models.elastic.resnet import STAGE_BLOCKS, ResNetFamily
from rayfl.models.elastic.space import Dimension, units_for
from rayfl.models.elastic.spec import FirstK, RandomSubset, Rolling, Selection, Selector, SubModelSpec, TopKNorm

SMALL = (8, 16, 32, 64)  # fast stand-in for HeteroFL's (64, 128, 256, 512)
TINY = (4, 8, 16, 32)
SELECTORS: list[Selector] = [FirstK(), Rolling(round_idx=5), RandomSubset(seed=3, keys=(11,)), TopKNorm()]
SELECTOR_IDS = ["firstk", "rolling", "random", "topk"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """The tensors here are tiny: intra-op threads only add spin-wait overhead on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def family(depth: int = 18, widths: tuple[int, ...] = SMALL, **kw: Any) -> ResNetFamily:
    return ResNetFamily(ResNetConfig(depth=depth, widths=widths, **kw))  # type: ignore[arg-type]


def global_model(f: ResNetFamily, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    g = f.global_model()
    with torch.no_grad():  # non-trivial norm affine parameters, so that misplaced gamma/beta would show
        for name, p in g.named_parameters():
            if p.ndim == 1 and name.endswith(".weight") and ".n" in f".{name}":
                p.uniform_(0.5, 1.5)
            elif p.ndim == 1 and name.endswith(".bias") and ".n" in f".{name}":
                p.uniform_(-0.2, 0.2)
    return g


def images(n: int = 2, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=gen)


def selection(f: ResNetFamily, spec: SubModelSpec, g: nn.Module) -> Selection:
    return f.select(spec, g.state_dict() if isinstance(spec.selector, TopKNorm) else None)


def mixed_ratios(f: ResNetFamily, seed: int, skip: bool, lo: float = 0.1, hi: float = 1.0) -> tuple[float, ...]:
    """A random ratio per dimension; with ``skip``, some skippable dims (at least one) at 0."""
    rng = np.random.default_rng(seed)
    ratios = rng.uniform(lo, hi, len(f.space.dims))
    if skip:
        skippable = np.flatnonzero(f.space.skippable)
        drop = skippable[rng.random(len(skippable)) < 0.4]
        ratios[drop if len(drop) else skippable[:1]] = 0.0
    return tuple(float(r) for r in ratios)


def block_dims(f: ResNetFamily) -> dict[str, tuple[int, int, str]]:
    """Skippable dim name -> (stage, block, state_dict prefix of the block)."""
    out = {}
    for d in f.space.dims:
        if d.skippable:
            s, b = (int(x) for x in d.name.split(".")[:2])
            out[d.name] = (s, b, f"layers.{s}.{b}.")
    return out


# ----------------------------------------------------------------------------------------------- 1. all-ones spec
@pytest.mark.parametrize("depth", [18, 50])
@pytest.mark.parametrize("norm", ["bn", "gn", "none"])
def test_full_spec_reproduces_global_model(depth: int, norm: str) -> None:
    f = family(depth, norm=norm)
    g = global_model(f).eval()
    sel = f.select(SubModelSpec.uniform(f.space, 1.0))
    assert sel.units == f.full_units
    sub = f.extract(g.state_dict(), sel).eval()
    assert sub.state_dict().keys() == g.state_dict().keys()
    for name, t in sub.state_dict().items():
        assert torch.equal(t, g.state_dict()[name]), name
    x = images()
    with torch.no_grad():
        assert torch.equal(sub(x), g(x))


# ----------------------------------------------------------------------------- 2. sub-model == masked global model
def masked_global(f: ResNetFamily, g: nn.Module, sel: Selection) -> nn.Module:
    """The global model with every element the sub-model does not cover set to 0 (skipped blocks entirely)."""
    masked = copy.deepcopy(g)
    slices = f.slices(sel)
    with torch.no_grad():
        for name, t in masked.state_dict().items():
            keep = torch.zeros(t.shape, dtype=torch.bool)
            if name in slices:
                keep[slices[name].torch_index(tuple(t.shape))] = True
            t.mul_(keep)
    return masked


@pytest.mark.parametrize("depth", [18, 50])
@pytest.mark.parametrize("case", ["firstk-0.5", *(f"mixed-{i}" for i in SELECTOR_IDS)])
def test_submodel_equals_masked_global(depth: int, case: str) -> None:
    f = family(depth, norm="none", scaler=False, act="relu")
    g = global_model(f).eval()
    if case == "firstk-0.5":
        spec = SubModelSpec.uniform(f.space, 0.5)
    else:
        selector = SELECTORS[SELECTOR_IDS.index(case.split("-", 1)[1])]
        spec = SubModelSpec(mixed_ratios(f, seed=depth, skip=True), selector)
    sel = selection(f, spec, g)
    assert any(0 < k < n for k, n in zip(sel.units, f.full_units, strict=True))
    sub = f.extract(g.state_dict(), sel).eval()
    ref = masked_global(f, g, sel).eval()
    x = images()
    with torch.no_grad():
        out_sub, out_ref, out_full = sub(x), ref(x), g(x)
    assert torch.allclose(out_sub, out_ref, atol=1e-5, rtol=1e-5), (out_sub - out_ref).abs().max()
    assert not torch.allclose(out_sub, out_full, atol=1e-3)  # the sub-model is really a different function


# -------------------------------------------------------------------------------- 3. skipped block == identity
@pytest.mark.parametrize(
    ("depth", "dim_name", "norm", "train"),
    [(18, "0.1.mid", "bn", False), (18, "2.1.mid", "gn", True), (18, "0.0.mid", "none", False),
     (50, "2.3.mid1", "bn", True), (50, "0.1.mid1", "gn", False)],
)  # fmt: skip
def test_skipped_block_is_identity(depth: int, dim_name: str, norm: str, train: bool) -> None:
    f = family(depth, norm=norm)
    g = global_model(f)
    d = f.space.dim_index(dim_name)
    assert f.space.dims[d].skippable
    ratios = [1.0] * len(f.space.dims)
    ratios[d] = 0.0
    sel = f.select(SubModelSpec(tuple(ratios)))
    assert sel.units[d] == 0 and len(sel.index[d]) == 0
    sub = f.extract(g.state_dict(), sel)

    s, b, prefix = block_dims(f)[dim_name]
    ref = copy.deepcopy(g)
    cast(nn.Sequential, cast(nn.ModuleList, ref.layers)[s])[b] = nn.Identity()
    sub.train(train)
    ref.train(train)
    x = images()
    with torch.no_grad():
        out_sub, out_ref = sub(x), ref(x)
    assert torch.allclose(out_sub, out_ref, atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        assert not torch.allclose(out_sub, g.train(train)(x), atol=1e-4)  # the block did something in the global

    block_tensors = {n for n in g.state_dict() if n.startswith(prefix)}
    assert block_tensors and all(f.space.layouts[n].gate == d for n in block_tensors)
    assert not block_tensors & set(sub.state_dict())
    assert set(sub.state_dict()) == set(g.state_dict()) - block_tensors
    asg = f.assignment(sel)
    assert asg.skip == frozenset(block_tensors)  # skipped tensors are not sent ...
    assert not block_tensors & set(asg.slices)  # ... and have no slices
    assert f.space.num_params(sel.units) == sum(p.numel() for p in sub.parameters())


# ------------------------------------------------------------------------------ 4. extract -> scatter round trip
@pytest.mark.parametrize("depth", [18, 50])
@pytest.mark.parametrize("ratios", ["uniform-0.25", "mixed"])
@pytest.mark.parametrize("selector", SELECTORS, ids=SELECTOR_IDS)
def test_extract_scatter_round_trip(depth: int, ratios: str, selector: Selector) -> None:
    f = family(depth)
    g = global_model(f)
    if ratios == "mixed":
        spec = SubModelSpec(mixed_ratios(f, seed=7, skip=True), selector)
    else:
        spec = SubModelSpec.uniform(f.space, 0.25, selector)
    sel = selection(f, spec, g)
    gstate = g.state_dict()
    sub = f.extract(gstate, sel)
    values, slices = f.scatter(sub, sel)
    assert set(values) == set(slices) == set(sub.state_dict())
    for name, tslice in slices.items():
        expected = gstate[name][tslice.torch_index(tuple(gstate[name].shape))]
        assert values[name].shape == expected.shape == sub.state_dict()[name].shape, name
        assert torch.equal(values[name], expected), name
    # the slices are the sub-model's units per dimension, sorted and distinct
    for d, (k, idx) in enumerate(zip(sel.units, sel.index, strict=True)):
        assert len(idx) == k and len(np.unique(idx)) == k and np.all(np.diff(idx) > 0)
        assert k == 0 or (idx[0] >= 0 and idx[-1] < f.space.dims[d].size)


# --------------------------------------------------------------------------------------- 5. residual alignment
def axis_index(slices: dict[str, TensorSlice], name: str, axis: int) -> np.ndarray:
    i = slices[name].index[axis]
    assert i is not None, name
    return np.asarray(i)


@pytest.mark.parametrize("depth", [18, 50])
@pytest.mark.parametrize("selector", SELECTORS, ids=SELECTOR_IDS)
def test_residual_streams_stay_aligned(depth: int, selector: Selector) -> None:
    f = family(depth, norm="bn")
    g = global_model(f)
    for spec in (
        SubModelSpec.uniform(f.space, 0.5, selector),
        SubModelSpec(mixed_ratios(f, seed=1, skip=False, lo=0.1, hi=0.9), selector),
    ):
        sel = selection(f, spec, g)
        sl = f.slices(sel)

        stream = axis_index(sl, "conv1.weight", 0)
        assert len(stream) < f.space.dims[0].size  # a real subset, not everything
        for p in f.plans:
            pre, n_conv = p.prefix, (2 if p.kind == "basic" else 3)
            last = f"{pre}conv{n_conv}.weight"
            np.testing.assert_array_equal(axis_index(sl, f"{pre}n1.weight", 0), stream)
            np.testing.assert_array_equal(axis_index(sl, f"{pre}n1.bias", 0), stream)
            np.testing.assert_array_equal(axis_index(sl, f"{pre}conv1.weight", 1), stream)
            for i in range(1, n_conv):  # inside the block: conv i's outputs feed norm i+1 and conv i+1
                out_i = axis_index(sl, f"{pre}conv{i}.weight", 0)
                np.testing.assert_array_equal(axis_index(sl, f"{pre}n{i + 1}.weight", 0), out_i)
                np.testing.assert_array_equal(axis_index(sl, f"{pre}conv{i + 1}.weight", 1), out_i)
            if p.projection:
                np.testing.assert_array_equal(
                    axis_index(sl, f"{pre}shortcut.weight", 1), axis_index(sl, f"{pre}n1.weight", 0)
                )
                np.testing.assert_array_equal(axis_index(sl, f"{pre}shortcut.weight", 0), axis_index(sl, last, 0))
                stream = axis_index(sl, last, 0)
            else:
                assert f"{pre}shortcut.weight" not in sl
                np.testing.assert_array_equal(axis_index(sl, last, 0), stream)  # residual add: out set == input set
        np.testing.assert_array_equal(axis_index(sl, "n4.weight", 0), stream)
        np.testing.assert_array_equal(axis_index(sl, "linear.weight", 1), stream)
        assert sl["linear.weight"].index[0] is None and sl["linear.bias"].index[0] is None  # all classes


# ------------------------------------------------------------------------------------ 6. rolling / random cover
def test_rolling_and_random_cover_every_unit() -> None:
    f = family(50)
    sizes = f.full_units
    spec_ratios = tuple(0.25 for _ in sizes)
    cover_roll: list[set[int]] = [set() for _ in sizes]
    cover_rand: list[set[int]] = [set() for _ in sizes]
    for r in range(max(sizes)):
        for cover, sel in (
            (cover_roll, f.select(SubModelSpec(spec_ratios, Rolling(round_idx=r)))),
            (cover_rand, f.select(SubModelSpec(spec_ratios, RandomSubset(seed=3, keys=(r,))))),
        ):
            for d, idx in enumerate(sel.index):
                cover[d].update(idx.tolist())
    for d, n in enumerate(sizes):
        assert cover_roll[d] == set(range(n)), f.space.dims[d].name
        assert cover_rand[d] == set(range(n)), f.space.dims[d].name


def test_rolling_window_start_and_wraparound() -> None:
    f = family(18)
    d = f.space.dim_index("stream7")
    n = f.space.dims[d].size
    assert n == 64
    ratios = tuple(0.25 for _ in f.space.dims)  # k = 16 of 64
    # FedRolex: shift 0..n-1 cyclically by r = round mod n and keep the first k, i.e. {(n - r + j) mod n : j < k}
    sel = f.select(SubModelSpec(ratios, Rolling(round_idx=0)))
    np.testing.assert_array_equal(sel.index[d], np.arange(0, 16))
    sel = f.select(SubModelSpec(ratios, Rolling(round_idx=n + 3)))  # start 61: 61..63, 0..12 wraps around
    np.testing.assert_array_equal(sel.index[d], np.r_[np.arange(0, 13), np.arange(61, 64)])
    sel = f.select(SubModelSpec(ratios, Rolling(round_idx=48)))  # start 16
    np.testing.assert_array_equal(sel.index[d], np.arange(16, 32))
    # every dimension of a round starts at (size - round mod size) mod size
    r = 13
    sel = f.select(SubModelSpec(ratios, Rolling(round_idx=r)))
    for dim, k, idx in zip(f.space.dims, sel.units, sel.index, strict=True):
        expected = np.sort(((dim.size - r % dim.size) % dim.size + np.arange(k)) % dim.size)
        np.testing.assert_array_equal(idx, expected, err_msg=dim.name)
    # consecutive rounds move the window back by one unit
    a = f.select(SubModelSpec(ratios, Rolling(round_idx=20))).index[d]  # start 44: 44..59
    b = f.select(SubModelSpec(ratios, Rolling(round_idx=21))).index[d]  # start 43: 43..58
    assert set(b) - set(a) == {43} and set(a) - set(b) == {59}


def test_random_subset_depends_on_seed_and_keys_only() -> None:
    f = family(18)
    ratios = tuple(0.5 for _ in f.space.dims)
    a = f.select(SubModelSpec(ratios, RandomSubset(seed=3, keys=(1,))))
    b = f.select(SubModelSpec(ratios, RandomSubset(seed=3, keys=(1,))))
    c = f.select(SubModelSpec(ratios, RandomSubset(seed=3, keys=(2,))))
    assert all(np.array_equal(x, y) for x, y in zip(a.index, b.index, strict=True))
    assert any(not np.array_equal(x, y) for x, y in zip(a.index, c.index, strict=True))
    first_k = f.select(SubModelSpec(ratios))
    assert any(not np.array_equal(x, y) for x, y in zip(a.index, first_k.index, strict=True))


# ------------------------------------------------------------------------------------------------ 7. TopKNorm
def test_topk_norm_picks_largest_units_of_the_joint_stream() -> None:
    f = family(18)
    g = global_model(f)
    params = {k: v.clone() for k, v in g.state_dict().items()}
    stream = f.space.dim_index("stream5")  # written by 2.0.conv2, 2.0.shortcut and 2.1.conv2
    big = [3, 9, 17, 30]
    with torch.no_grad():  # each tensor writing the stream boosts different channels: scores must be summed
        params["layers.2.0.shortcut.weight"][3] *= 50
        params["layers.2.0.conv2.weight"][9] *= 50
        params["layers.2.1.conv2.weight"][[17, 30]] *= 50
        mid = f.space.dim_index("2.1.mid")
        params["layers.2.1.conv1.weight"][[0, 31]] *= 50
        params["linear.weight"][:, :5] *= 1000  # classifier columns do not score the stream
    ratios = [0.5] * len(f.space.dims)
    ratios[stream] = 4 / 32
    ratios[mid] = 2 / 32
    spec = SubModelSpec(tuple(ratios), TopKNorm())
    sel = f.select(spec, params)
    np.testing.assert_array_equal(sel.index[stream], big)
    np.testing.assert_array_equal(sel.index[mid], [0, 31])
    assert not np.array_equal(sel.index[f.space.dim_index("stream7")], np.arange(32))

    # against an independent computation of every dimension's unit norms
    scores = [np.zeros(d.size) for d in f.space.dims]
    for name, lay in f.space.layouts.items():
        if lay.axes[0] is not None and len(lay.shape) >= 2:
            scores[lay.axes[0].dim] += params[name].double().pow(2).flatten(1).sum(1).numpy()
    for d, idx in enumerate(sel.index):
        rest = np.setdiff1d(np.arange(f.space.dims[d].size), idx)
        if len(rest):
            assert scores[d][idx].min() >= scores[d][rest].max(), f.space.dims[d].name

    # deterministic, also under ties (equal norms: the lowest indices)
    again = f.select(spec, {k: v.clone() for k, v in params.items()})
    assert all(np.array_equal(x, y) for x, y in zip(sel.index, again.index, strict=True))
    ones = {k: torch.ones_like(v) for k, v in params.items()}
    tied = f.select(spec, ones)
    for k, idx in zip(tied.units, tied.index, strict=True):
        np.testing.assert_array_equal(idx, np.arange(k))
    with pytest.raises(ValueError, match="TopKNorm"):
        f.select(spec)


# ----------------------------------------------------------------------------------------- 8. classifier rows
def test_scatter_rows_keeps_only_those_classes() -> None:
    f = family(18)
    g = global_model(f)
    with torch.no_grad():
        g.get_parameter("linear.bias").uniform_(-1, 1)
    gstate = g.state_dict()
    sel = f.select(SubModelSpec.uniform(f.space, 0.5, Rolling(round_idx=7)))
    sub = f.extract(gstate, sel)
    rows = np.array([1, 3])
    values, slices = f.scatter(sub, sel, rows=rows)
    plain_values, plain_slices = f.scatter(sub, sel)
    last = f.plans[-1].stream_out
    assert values["linear.weight"].shape == (2, sel.units[last])
    assert torch.equal(values["linear.weight"], sub.state_dict()["linear.weight"][[1, 3]])
    assert torch.equal(values["linear.bias"], sub.state_dict()["linear.bias"][[1, 3]])
    np.testing.assert_array_equal(slices["linear.weight"].index[0], rows)
    np.testing.assert_array_equal(slices["linear.weight"].index[1], sel.index[last])
    np.testing.assert_array_equal(slices["linear.bias"].index[0], rows)
    for name in ("linear.weight", "linear.bias"):
        expected = gstate[name][slices[name].torch_index(tuple(gstate[name].shape))]
        assert torch.equal(values[name], expected)
    for name in plain_values:  # everything else is as without rows
        if name not in f.space.classifier:
            assert torch.equal(values[name], plain_values[name])
            assert all(
                (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))
                for a, b in zip(slices[name].index, plain_slices[name].index, strict=True)
            )


# ----------------------------------------------------------------------------------------- 9. parameter counts
@pytest.mark.parametrize(("depth", "expected"), [(18, 11_172_170), (34, 21_280_330), (50, 23_513_162)])
def test_parameter_counts_match_heterofl(depth: int, expected: int) -> None:
    f = ResNetFamily(ResNetConfig(depth=depth), num_classes=10)  # type: ignore[arg-type]
    assert f.space.num_params(f.full_units) == expected


def test_built_model_counts_equal_layout_counts() -> None:
    f = ResNetFamily(ResNetConfig(depth=18), num_classes=10)
    g = f.global_model()
    assert set(g.state_dict()) == set(f.space.layouts)
    assert sum(p.numel() for p in g.parameters()) == f.space.num_params(f.full_units) == 11_172_170
    for depth in (18, 50):
        fs = family(depth)
        for ratios in (mixed_ratios(fs, seed=5, skip=True), tuple(0.25 for _ in fs.space.dims)):
            units = fs.space.units(ratios)
            model = fs.build(units)
            assert sum(p.numel() for p in model.parameters()) == fs.space.num_params(units)
            for name, t in model.state_dict().items():
                assert tuple(t.shape) == fs.space.sub_shape(name, units), name


# ------------------------------------------------------------------------------- 10. every depth trains a step
def sgd_step(model: nn.Module) -> None:
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    logits = model(images())
    assert logits.shape == (2, 10)
    loss = nn.functional.cross_entropy(logits, torch.tensor([1, 7]))
    assert torch.isfinite(loss)
    loss.backward()  # type: ignore[no-untyped-call]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    opt.step()
    after = model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "linear.weight" in changed and "linear.bias" in changed and "conv1.weight" in changed
    assert all(torch.isfinite(v).all() for v in after.values())


@pytest.mark.parametrize("depth", sorted(STAGE_BLOCKS))
def test_every_depth_builds_and_trains_smallest_and_largest(depth: int) -> None:
    f = family(depth, widths=TINY)
    g = global_model(f)
    smallest = tuple(0.0 if d.skippable else 0.0625 for d in f.space.dims)
    sel = f.select(SubModelSpec(smallest))
    expected = tuple(0 if d.skippable else max(1, math.ceil(d.size / 16)) for d in f.space.dims)
    assert sel.units == expected
    sub = f.extract(g.state_dict(), sel)
    n_blocks = sum(STAGE_BLOCKS[depth][1])
    stages = cast(nn.ModuleList, sub.layers)
    n_identity = sum(isinstance(m, nn.Identity) for stage in stages for m in cast(nn.Sequential, stage))
    assert n_identity == n_blocks - sum(p.projection for p in f.plans)
    sgd_step(sub)
    sgd_step(f.extract(g.state_dict(), f.select(SubModelSpec.uniform(f.space, 1.0))))


# ---------------------------------------------------------------------------------------- 11. units_for rounding
def test_units_for_rounding_and_errors() -> None:
    d = Dimension("d", 10)
    assert units_for(d, 1.0) == 10
    assert units_for(d, 0.25) == 3  # ceil(2.5)
    assert units_for(Dimension("d", 100), 0.07) == 7  # 0.07 * 100 = 7.000000000000001 in floating point
    for size in (25, 29, 35, 38, 64, 100):  # a ratio computed as k / size keeps exactly k units
        assert [units_for(Dimension("d", size), k / size) for k in range(1, size + 1)] == list(range(1, size + 1))
    assert units_for(d, 0.01) == 1  # at least one unit
    assert units_for(Dimension("w", 64), 0.0625) == 4
    assert units_for(Dimension("w", 64), 0.1) == 7
    assert units_for(Dimension("w", 512), 0.0625) == 32
    for ratio in (0.0625, 0.125, 0.25, 0.5, 1.0):  # HeteroFL's levels: ceil(rate * h)
        for size in (64, 128, 256, 512, 2048):
            assert units_for(Dimension("h", size), ratio) == math.ceil(ratio * size)
    with pytest.raises(ValueError, match="cannot be skipped"):
        units_for(d, 0.0)
    assert units_for(Dimension("s", 10, skippable=True), 0.0) == 0
    with pytest.raises(ValueError, match="above 1"):
        units_for(d, 1.01)
    with pytest.raises(ValueError, match="above 1"):
        units_for(Dimension("s", 10, skippable=True), 1.5)
    f = family(18)
    with pytest.raises(ValueError, match="ratios"):
        f.space.units((1.0,))
    with pytest.raises(ValueError, match="cannot be skipped"):
        f.select(SubModelSpec(tuple(0.0 for _ in f.space.dims)))
