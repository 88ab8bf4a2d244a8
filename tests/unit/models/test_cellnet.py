"""Transformable networks (FedTrans's cells): function-preserving widen and deepen, MobileNetV3-small coverage, and the
elastic family's costs.

Widen and deepen must leave every output unchanged without noise (max abs difference <= 1e-5), in evaluation mode
(running statistics) and in training mode (batch statistics), for every cell of the CNN and the small ResNet-18 and
for the kinds of cell MobileNetV3-small adds (depthwise, squeeze-and-excitation, hard-swish, classifier).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.model import CellNetConfig
from rayfl.models import InputSpec
from rayfl.models.cellnet import apply_step, deepen_step, parse_step, tensor_name, transform_params, widen_step
from rayfl.models.cellnet.module import CellNet
from rayfl.models.cellnet.transform import build_graph
from rayfl.models.elastic import CostModel
from rayfl.models.elastic.cost import saved_tensors
from rayfl.models.families import build_family

SPEC = InputSpec("image", 10, (3, 32, 32))


def _params(cfg: CellNetConfig, seed: int = 0) -> tuple[CellNet, dict[str, torch.Tensor]]:
    """A model whose norms have non-trivial affine weights and running statistics (so preservation is not vacuous)."""
    torch.manual_seed(seed)
    model = CellNet(build_graph(cfg, 3, 10, 32))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1.0, 1.0)
                m.running_var.uniform_(0.5, 2.0)
            if isinstance(m, nn.BatchNorm2d | nn.GroupNorm):
                m.weight.uniform_(0.5, 2.0)
                m.bias.uniform_(-1.0, 1.0)
    return model, {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}


def _outputs(graph: object, params: dict[str, torch.Tensor], x: torch.Tensor, mode: str) -> torch.Tensor:
    model = CellNet(graph)  # type: ignore[arg-type]
    model.load_state_dict(params, strict=False)
    model.train(mode == "train")
    with torch.no_grad():
        out: torch.Tensor = model(x)
    return out


def _steps(graph: object, cells: list[str]) -> list[str]:
    steps = []
    for name in cells:
        if graph.op(name).dim != "classes":  # type: ignore[attr-defined]
            steps.append(widen_step(name, 2))
        steps.append(deepen_step(name))
    return steps


@pytest.mark.parametrize(
    ("cfg", "cells", "modes"),
    [
        (CellNetConfig(base="cnn", channels=(8, 16, 16)), None, ("eval", "train")),
        (CellNetConfig(base="cnn", channels=(8, 12), norm="group", head_pool=4), None, ("eval", "train")),
        (CellNetConfig(base="resnet", channels=(4, 4, 8, 8)), None, ("eval",)),  # train mode: cnn-batch
        # depthwise, expand, squeeze/excite, projection into a residual stream, hard-swish classifier layer, head
        (
            CellNetConfig(base="mobilenet_v3_small"),
            ["b1dw", "b5e", "b5dw", "b5se1", "b5se2", "b6p", "fc", "head"],
            ("eval",),
        ),
        # every cell of both preserves the function too (checked once by hand: 31 cells x 2 steps, about 2 min);
        # here a cell of each kind and place: expansion, depthwise, squeeze, projection into a residual stream
        pytest.param(CellNetConfig(base="mobilenet_tiny"), ["b1dw", "b1se1", "b3p"], ("eval",), marks=pytest.mark.slow),
        # a cell edge, an edge summed into a node, the reduction's shortcut
        pytest.param(CellNetConfig(base="nb201"), ["c1e01", "c1e23", "r2sc"], ("eval",), marks=pytest.mark.slow),
    ],
    ids=["cnn-batch", "cnn-group", "resnet18", "mobilenet_v3_small", "mobilenet_tiny", "nb201"],
)
def test_widen_and_deepen_preserve_the_function(cfg: CellNetConfig, cells: list[str] | None, modes: tuple[str]) -> None:
    _, params = _params(cfg)
    graph = build_graph(cfg, 3, 10, 32)
    x = torch.randn(6, 3, 32, 32)
    names = cells if cells is not None else [op.name for op in graph.cells]
    for step in _steps(graph, names):
        child, child_params = transform_params(graph, params, step)
        assert child != graph
        for mode in modes:
            diff = (_outputs(graph, params, x, mode) - _outputs(child, child_params, x, mode)).abs().max()
            assert float(diff) <= 1e-5, (step, mode, float(diff))


def test_transformations_compose_and_change_the_architecture_as_logged() -> None:
    cfg = CellNetConfig(base="resnet", channels=(8, 8, 16, 16))
    _, params = _params(cfg)
    graph = build_graph(cfg, 3, 10, 32)
    x = torch.randn(4, 3, 32, 32)
    steps = ("widen s2b1c2 2", "deepen s2b1c1", "widen s2b1c1_d1 3", "deepen s2b1c1", "deepen head")
    g, p = graph, params
    for step in steps:
        g, p = transform_params(g, p, step)
    assert g == build_graph(CellNetConfig(base="resnet", channels=(8, 8, 16, 16), transforms=steps), 3, 10, 32)
    # the stream of stage 2 doubled; the inserted cell's own dimension x3, the cell it follows unchanged
    assert g.size("s2") == 16 and g.size("s2b1") == 8 and g.size("s2b1c1_d1") == 24
    assert {"s2b1c1_d1", "s2b1c1_d1_a", "s2b1c1_d2", "head_d1"} <= {op.name for op in g.ops}
    # the second insertion sits between the first cell and the first insertion, on a dimension of its own
    assert g.op("s2b1c1_d2").in_dim == "s2b1" and g.op("s2b1c1_d1").in_dim == "s2b1c1_d2"
    assert g.op("head_d1").dim == "classes"  # after the classifier: the classes, never a dimension of its own
    assert tuple(p[tensor_name("s2b1sc", "weight")].shape) == (16, 8, 1, 1)  # the shortcut writes the widened stream
    diff = (_outputs(graph, params, x, "eval") - _outputs(g, p, x, "eval")).abs().max()
    assert float(diff) <= 1e-5


def _two_cells(deepen_width: str = "own") -> tuple[CellNetConfig, dict[str, torch.Tensor], object]:
    cfg = CellNetConfig(base="cnn", channels=(4, 6), deepen_width=deepen_width)  # type: ignore[arg-type]
    _, params = _params(cfg)
    return cfg, params, build_graph(cfg, 3, 10, 32)


def test_an_inserted_cell_widens_alone() -> None:
    """Paper 002 Fig. 5: a cell inserted by deepen is a cell of its own; widening it leaves the cell it follows (and
    that cell's norm and the pooling after it) at their width, and widening that cell leaves the inserted one's."""
    _, params, graph = _two_cells()
    g, p = transform_params(graph, params, deepen_step("c1"))  # type: ignore[arg-type]
    assert g.op("c1_d1").in_dim == "c1" and g.op("c1_d1").dim == "c1_d1" and g.op("c2").in_dim == "c1_d1"
    assert g.op("c1_p").dim == "c1_d1" and g.op("c1_n").dim == "c1"  # the pool after the insertion moved with it
    wide, wp = transform_params(g, p, widen_step("c1_d1", 2))
    assert wide.size("c1") == 4 and wide.size("c1_d1") == 8
    assert tuple(wp["layers.c1.weight"].shape) == (4, 3, 3, 3) and tuple(wp["layers.c1_n.weight"].shape) == (4,)
    assert tuple(wp["layers.c1_d1.weight"].shape) == (8, 4, 3, 3)
    assert tuple(wp["layers.c2.weight"].shape) == (6, 8, 3, 3)
    other, op_ = transform_params(g, p, widen_step("c1", 3))
    assert other.size("c1") == 12 and other.size("c1_d1") == 4
    assert tuple(op_["layers.c1_d1.weight"].shape) == (4, 12, 3, 3)
    assert tuple(op_["layers.c2.weight"].shape) == (6, 4, 3, 3)


def test_the_shared_width_option_keeps_the_old_coupling() -> None:
    cfg, params, graph = _two_cells("shared")
    g, _ = transform_params(graph, params, deepen_step("c1"), own_width=False)  # type: ignore[arg-type]
    assert g.op("c1_d1").dim == "c1"
    assert g == build_graph(dataclasses.replace(cfg, transforms=("deepen c1",)), 3, 10, 32)
    wide = apply_step(g, widen_step("c1_d1", 2), own_width=False)
    assert wide.size("c1") == 8  # widening the inserted cell widens the cell it follows


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_widen_and_deepen_composed_keep_the_function(norm: str) -> None:
    """Widen and deepen alternated on a cell and on the cells inserted after it (each on its own width) leave the
    outputs unchanged (max abs difference <= 1e-5, evaluation and training mode)."""
    cfg = CellNetConfig(base="cnn", channels=(4, 6), norm=norm)  # type: ignore[arg-type]
    _, params = _params(cfg)
    graph = build_graph(cfg, 3, 10, 32)
    steps = (
        "widen c1 2", "deepen c1", "widen c1_d1 2", "deepen c1_d1", "widen c1 3", "widen c1_d1_d1 2",
        "deepen c2", "widen c2_d1 2", "widen c2 2",
    )  # fmt: skip
    g, p = graph, params
    for step in steps:
        g, p = transform_params(g, p, step)
    assert g == build_graph(dataclasses.replace(cfg, transforms=steps), 3, 10, 32)
    assert (g.size("c1"), g.size("c1_d1"), g.size("c1_d1_d1"), g.size("c2"), g.size("c2_d1")) == (24, 16, 32, 12, 12)
    x = torch.randn(6, 3, 32, 32)
    for mode in ("eval", "train"):
        diff = (_outputs(graph, params, x, mode) - _outputs(g, p, x, mode)).abs().max()
        assert float(diff) <= 1e-5, (mode, float(diff))


@pytest.mark.slow
@pytest.mark.parametrize(("base", "shape"), [("mobilenet_tiny", (3, 32, 32)), ("nb201", (1, 28, 28))])
def test_the_cpu_sized_starting_models_offer_choice_at_a_cost_every_client_can_train(
    base: str, shape: tuple[int, int, int]
) -> None:
    """Issue 24: FedTrans's starting models for the CIFAR-like (MobileNetV3-small-shaped) and FEMNIST-like
    (NAS-Bench-201-shaped) settings have at least 6 candidate cells (the classifier aside) and cost at most 2 MFLOPs
    forward per sample: the weakest client of ``experiments/fedtrans`` (1 GFLOP/s for 0.3 s) trains 50 samples a
    round at 3 x forward FLOPs each."""
    cfg = CellNetConfig(base=base, head_pool=1)  # type: ignore[arg-type]
    graph = build_graph(cfg, shape[0], 10, shape[1])
    assert len([op for op in graph.cells if op.dim != "classes"]) >= 6
    family = build_family(cfg, InputSpec("image", 10, shape))
    forward = float(CostModel(family, 10).evaluate(np.array([family.full_units])).flops[0])
    assert 3 * forward * 50 <= 1e9 * 0.3


def test_widen_duplicates_first_and_divides_consumers() -> None:
    cfg = CellNetConfig(base="cnn", channels=(4, 6), norm="none")
    _, params = _params(cfg)
    graph = build_graph(cfg, 3, 10, 32)
    _, new = transform_params(graph, params, widen_step("c1", 3))
    w1, w2 = params["layers.c1.weight"], params["layers.c2.weight"]
    assert torch.equal(new["layers.c1.weight"][:4], w1) and torch.equal(new["layers.c1.weight"][8:], w1)
    assert torch.allclose(new["layers.c2.weight"][:, :4], w2 / 3) and torch.allclose(
        new["layers.c2.weight"][:, 4:8], w2 / 3
    )
    _, noisy = transform_params(
        graph, params, widen_step("c1", 3), noise=0.05, generator=torch.Generator().manual_seed(0)
    )
    copies = noisy["layers.c1.weight"][4:]
    assert torch.equal(noisy["layers.c1.weight"][:4], w1)  # the originals stay exact
    assert not torch.equal(copies[:4], w1) and float((copies[:4] - w1).std()) < 0.2 * float(w1.std())


def test_group_norm_groups_grow_with_the_width() -> None:
    cfg = CellNetConfig(base="cnn", channels=(8, 8), norm="group")
    graph = apply_step(build_graph(cfg, 3, 10, 32), widen_step("c1", 2))
    assert graph.op("c1_n").groups == 8 and graph.size("c1") == 16


def test_mobilenet_v3_small_is_torchvisions() -> None:
    """torchvision's weights, loaded in order, give the same outputs: the cell graph covers MobileNetV3-small."""
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    reference = models.mobilenet_v3_small(num_classes=10).eval()
    ours = CellNet(build_graph(CellNetConfig(base="mobilenet_v3_small"), 3, 10, 32)).eval()
    theirs = [v for v in reference.state_dict().values() if v.is_floating_point()]
    mine = [k for k, v in ours.state_dict().items() if v.is_floating_point()]
    assert len(theirs) == len(mine)
    ours.load_state_dict(dict(zip(mine, theirs, strict=True)), strict=False)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert float((reference(x) - ours(x)).abs().max()) <= 1e-5


@pytest.mark.parametrize("step", ["widen head 2", "widen nothing 2", "deepen c1_n", "grow c1", "widen c1 1"])
def test_bad_steps_are_refused(step: str) -> None:
    graph = build_graph(CellNetConfig(base="cnn", channels=(4, 4)), 3, 10, 32)
    with pytest.raises(ValueError):
        apply_step(graph, step)


def test_parse_step() -> None:
    assert parse_step("widen c1 2") == ("widen", "c1", 2)
    assert parse_step("deepen head") == ("deepen", "head", 1)
    assert parse_step("reset") == ("reset", "", 1)


def test_family_costs_equal_the_measured_forward_flops() -> None:
    steps = ("widen c2 2", "deepen c2", "deepen head")
    cfg = CellNetConfig(base="cnn", channels=(8, 16), head_pool=2, transforms=steps)
    family = build_family(cfg, SPEC)
    cost = CostModel(family, 10, use_disk_cache=False)
    full = np.array(family.full_units)
    half = np.maximum(1, full // 2)
    costs = cost.evaluate(np.stack([full, half]))
    for units, flops in zip((full, half), costs.flops, strict=True):
        model = family.build(tuple(int(u) for u in units))
        _, _, measured = saved_tensors(model, torch.randn(2, 3, 32, 32))
        assert flops == pytest.approx(measured / 2, rel=1e-9)
    sub = family.build(tuple(int(u) for u in half))  # a sub-model uses batch statistics (HeteroFL's static BN)
    names = {k for k, v in sub.state_dict().items() if v.is_floating_point()}
    stats = {n for n in family.space.layouts if n.endswith((".running_mean", ".running_var"))}
    assert stats and names == set(family.space.layouts) - stats
    whole = family.build(family.full_units)  # the whole model keeps running statistics, and nothing else
    assert set(whole.state_dict()) == set(family.space.layouts)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model: {name: cellnet, transforms: ['widen zz 2']}", r"model.transforms\[0\]: transform: no cell named 'zz'"),
        ("model: {name: cellnet, transforms: ['deepen c1', 'grow c1']}", r"model.transforms\[1\]: transform step"),
        ("model: {name: cellnet, base: resnet, channels: [4, 8]}", r"model.blocks: needs one block count per stage"),
        ("model: {name: cnn}\nalgorithm: {name: fedtrans}", r"algorithm.name: 'fedtrans' transforms cells"),
        ("model: {name: cnn}\nalgorithm: {name: splitmix}", r"algorithm.name: 'splitmix' trains base models"),
        ("model: {name: ensemble, width: 0}", r"model.width"),
    ],
)
def test_bad_cellnet_configs_are_one_line_errors(tmp_path: object, text: str, message: str) -> None:
    from pathlib import Path

    from rayfl.core.errors import ConfigError
    from rayfl.experiment.loader import load_config

    path = Path(str(tmp_path)) / "bad.yaml"
    path.write_text(text + "\ndata: {name: synthetic}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path)
