"""``model.elastic: width``: a realised supernet path as a width-elastic family (issue 25's "FjORD on the supernet's
ops"). One tiny path, checked by hand: its ordered-dropout sub-model, its forward pass, its FLOPs and parameters."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rayfl.config.model import SupernetConfig
from rayfl.config.model_rules import supernet_problems
from rayfl.models.elastic.cost import CostModel
from rayfl.models.elastic.spec import SubModelSpec
from rayfl.models.supernet import SupernetFamily
from rayfl.models.supernet_width import SupernetWidthFamily

# stem 4, one stage of one official MBConv mb3_e2 (hidden 8), a reduction to 6 channels, 8x8 images, 10 classes
CFG = SupernetConfig(
    stem_channels=4, blocks_per_stage=(1,), ops=("mb3_e2", "identity"), path=("mb3_e2",), elastic="width"
)


def _family() -> SupernetWidthFamily:
    return SupernetWidthFamily(CFG, in_channels=3, num_classes=10, image_size=8)


def test_dimensions_are_the_streams_and_the_mbconv_width() -> None:
    family = _family()
    assert [(d.name, d.size, d.skippable) for d in family.space.dims] == [
        ("stream0", 4, False),
        ("stream1", 6, False),
        ("layers.0.hidden", 8, False),
    ]
    # the full width is the realised path of the ops family: the same tensor names and shapes
    ops = SupernetFamily(dataclasses.replace(CFG, elastic="ops"), in_channels=3, num_classes=10, image_size=8)
    width_state = family.global_model().state_dict()
    ops_state = ops.global_model().state_dict()
    assert {k: v.shape for k, v in width_state.items()} == {k: v.shape for k, v in ops_state.items()}


def test_submodel_at_half_width_is_the_first_k_slice_and_computes_the_block_by_hand() -> None:
    """p = 0.5 keeps 2 of 4 stem channels, 4 of 8 expanded channels (the SE's too) and 3 of 6 after the reduction.
    Every sub-model tensor is the hand-written leading slice of the global one, and its logits are those of the
    block written out with torch.nn.functional on those slices (batch-statistics BN, as every rayfl family)."""
    family = _family()
    torch.manual_seed(0)
    global_model = family.global_model()
    with torch.no_grad():
        for p in global_model.parameters():
            p.copy_(torch.randn_like(p))  # BN affines away from 1/0, so a wrong slice shows
    g = global_model.state_dict()
    selection = family.select(SubModelSpec.uniform(family.space, 0.5))
    assert selection.units == (2, 3, 4)
    sub = family.extract(g, selection)
    c, c1, h = 2, 3, 4
    hand = {
        "stem.0.weight": g["stem.0.weight"][:c],
        "stem.1.weight": g["stem.1.weight"][:c],
        "stem.1.bias": g["stem.1.bias"][:c],
        "layers.0.0.0.weight": g["layers.0.0.0.weight"][:h, :c],
        "layers.0.0.1.weight": g["layers.0.0.1.weight"][:h],
        "layers.0.0.1.bias": g["layers.0.0.1.bias"][:h],
        "layers.0.0.3.squeeze.weight": g["layers.0.0.3.squeeze.weight"][:h, :h],
        "layers.0.0.3.squeeze.bias": g["layers.0.0.3.squeeze.bias"][:h],
        "layers.0.0.3.excite.weight": g["layers.0.0.3.excite.weight"][:h, :h],
        "layers.0.0.3.excite.bias": g["layers.0.0.3.excite.bias"][:h],
        "layers.0.0.4.weight": g["layers.0.0.4.weight"][:c, :h],
        "layers.0.0.5.weight": g["layers.0.0.5.weight"][:c],
        "layers.0.0.5.bias": g["layers.0.0.5.bias"][:c],
        "reductions.0.main.0.weight": g["reductions.0.main.0.weight"][:c],
        "reductions.0.main.1.weight": g["reductions.0.main.1.weight"][:c],
        "reductions.0.main.1.bias": g["reductions.0.main.1.bias"][:c],
        "reductions.0.main.3.weight": g["reductions.0.main.3.weight"][:c1, :c],
        "reductions.0.main.4.weight": g["reductions.0.main.4.weight"][:c1],
        "reductions.0.main.4.bias": g["reductions.0.main.4.bias"][:c1],
        "reductions.0.shortcut.0.weight": g["reductions.0.shortcut.0.weight"][:c1, :c],
        "reductions.0.shortcut.1.weight": g["reductions.0.shortcut.1.weight"][:c1],
        "reductions.0.shortcut.1.bias": g["reductions.0.shortcut.1.bias"][:c1],
        "head.weight": g["head.weight"][:, :c1],
        "head.bias": g["head.bias"],
    }
    state = sub.state_dict()
    assert set(state) == set(hand)
    for name, tensor in hand.items():
        assert torch.equal(state[name], tensor), name

    def bn(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.batch_norm(x, None, None, hand[f"{prefix}.weight"], hand[f"{prefix}.bias"], training=True)

    x = torch.randn(5, 3, 8, 8)
    s = torch.relu(bn(F.conv2d(x, hand["stem.0.weight"], padding=1), "stem.1"))
    e = torch.relu(bn(F.conv2d(s, hand["layers.0.0.0.weight"], padding=1), "layers.0.0.1"))
    pooled = e.mean(dim=(2, 3), keepdim=True)
    squeezed = torch.relu(F.conv2d(pooled, hand["layers.0.0.3.squeeze.weight"], hand["layers.0.0.3.squeeze.bias"]))
    gate = torch.sigmoid(F.conv2d(squeezed, hand["layers.0.0.3.excite.weight"], hand["layers.0.0.3.excite.bias"]))
    block = s + bn(F.conv2d(e * gate, hand["layers.0.0.4.weight"]), "layers.0.0.5")
    main = torch.relu(
        bn(F.conv2d(block, hand["reductions.0.main.0.weight"], stride=2, padding=1, groups=c), "reductions.0.main.1")
    )
    main = bn(F.conv2d(main, hand["reductions.0.main.3.weight"]), "reductions.0.main.4")
    short = bn(F.conv2d(block, hand["reductions.0.shortcut.0.weight"], stride=2), "reductions.0.shortcut.1")
    logits = F.linear(torch.relu(main + short).mean(dim=(2, 3)), hand["head.weight"], hand["head.bias"])
    assert torch.allclose(sub(x), logits, atol=1e-5)  # (torch.testing imports torch.distributed: 7 s)


@pytest.mark.slow  # fits every piece afresh (no disk cache): 23 s at load 5
def test_flops_and_params_against_the_cost_model_by_hand() -> None:
    """At p = 0.5 (c 2, h 4, c' 3; 8x8 maps, 4x4 after the reduction), forward FLOPs per sample (2 per multiply-add,
    convolutions and the linear layer, as the cost model's counter): stem 2 x 27 x 2 x 64 = 6,912; MBConv expansion
    2 x 9 x 2 x 4 x 64 = 9,216, its SE 2 x (2 x 4 x 4) = 64 (two 1x1 convs on the pooled map: h x h, quadratic in
    one dimension), projection 2 x 4 x 2 x 64 = 1,024; reduction depthwise 2 x 9 x 2 x 16 = 576, pointwise and
    shortcut 2 x (2 x 2 x 3 x 16) = 384; head 2 x 3 x 10 = 60: 18,236. Parameters: stem 54 + 4, MBConv 72 + 8 + SE
    2 x (16 + 4) + 8 + 4 = 132, reduction 18 + 4 + 6 + 6 + 6 + 6 = 46, head 30 + 10: 276. At full width the costs
    are the ops family's for the same path."""
    family = _family()
    cost = CostModel(family, 4, use_disk_cache=False)
    assert cost.max_check_error == 0.0
    half = family.space.units(SubModelSpec.uniform(family.space, 0.5).ratios)
    c = cost.evaluate(np.array([half]))
    assert c.flops[0] == 6912 + 9216 + 64 + 1024 + 576 + 384 + 60 == 18_236
    assert c.params[0] == 54 + 4 + 132 + 46 + 40 == 276
    assert c.params[0] == sum(p.numel() for p in family.build(half).parameters())
    ops = SupernetFamily(dataclasses.replace(CFG, elastic="ops"), in_channels=3, num_classes=10, image_size=8)
    full_ops = CostModel(ops, 4, use_disk_cache=False).evaluate(np.array([ops.full_units]))
    full = cost.evaluate(np.array([family.full_units]))
    assert (full.flops[0], full.params[0]) == (full_ops.flops[0], full_ops.params[0])
    # a conv1 op (c x c, the other quadratic product) on a two-stage path: cost model = counted, at two widths
    two = SupernetConfig(
        stem_channels=4, blocks_per_stage=(1, 1), ops=("conv1", "ds3_e1"), path=("conv1", "ds3_e1"), elastic="width"
    )
    fam2 = SupernetWidthFamily(two, in_channels=3, num_classes=10, image_size=8)
    cost2 = CostModel(fam2, 4, use_disk_cache=False)
    from torch.utils.flop_counter import FlopCounterMode

    for p in (0.5, 1.0):
        units = fam2.space.units(SubModelSpec.uniform(fam2.space, p).ratios)
        model = fam2.build(units)
        counter = FlopCounterMode(display=False)
        with counter:
            model(torch.randn(1, 3, 8, 8))
        got = cost2.evaluate(np.array([units]))
        assert got.flops[0] == counter.get_total_flops()
        assert got.params[0] == sum(t.numel() for t in model.parameters())


def test_width_needs_a_path_and_fedoras_refuses_it() -> None:
    problems = supernet_problems(SupernetConfig(elastic="width"))
    assert problems == [(("model", "elastic"), "width needs model.path (the path whose widths shrink)")]
    with pytest.raises(ValueError, match=r"needs model\.path"):
        SupernetWidthFamily(SupernetConfig(elastic="width"))


@pytest.mark.slow
def test_fjord_runs_on_the_width_family() -> None:
    """FjORD (ordered dropout with self-distillation) on the tiny path, two rounds in-process, with nothing FjORD
    knows about this family: finite losses and a finite global model of the full shape."""
    from rayfl.engine.driver import run_experiment
    from rayfl.fl.methods.fjord.config import FjORDConfig
    from tests.helpers import tiny_config, tiny_image_dataset

    cfg = dataclasses.replace(
        tiny_config(kind="local"), rounds=2, algorithm=FjORDConfig(widths=(0.5, 1.0), kd=True), model=CFG
    )
    data = tiny_image_dataset()
    family = SupernetWidthFamily(CFG, in_channels=3, num_classes=4, image_size=8)
    before = family.global_model()
    result = run_experiment(cfg, write=False, dataset=data)
    assert all(np.isfinite(r.train_loss) for r in result.records)
    weight = result.state.params["layers.0.0.3.squeeze.weight"]  # the SE's h x h: rows and columns first-k
    assert weight.shape == before.state_dict()["layers.0.0.3.squeeze.weight"].shape == (8, 8, 1, 1)
    assert torch.isfinite(weight).all()
