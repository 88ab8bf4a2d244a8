"""OPA aggregation (paper 003 Eq. 5) through the engine's element-wise reducer, on a hand-made two-client case."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from rayfl.config.model import SupernetConfig
from rayfl.core.messages import ClientUpdate
from rayfl.core.reducers import MaskedWeightedMean
from rayfl.fl.methods.fedoras.algorithm import opa_update
from rayfl.models.supernet import SupernetFamily


def _family() -> SupernetFamily:
    # one searchable layer with ops 0 = conv1, 1 = ds3_e1, 2 = mb3_e1, 3 = identity
    cfg = SupernetConfig(stem_channels=2, blocks_per_stage=(1,), ops=("conv1", "ds3_e1", "mb3_e1", "identity"))
    return SupernetFamily(cfg, in_channels=1, num_classes=2, image_size=4)


def _update(client_id: int, value: float, examples: int, shapes: dict[str, torch.Size]) -> ClientUpdate:
    return ClientUpdate(
        client_id=client_id,
        weight=float(examples),
        values={k: torch.full(s, value) for k, s in shapes.items()},
        slices={},
        num_examples=examples,
        train_loss=0.0,
        num_steps=1,
    )


def test_opa_two_clients_with_an_op_only_one_used_and_one_nobody_used() -> None:
    """Client A pushed 30 examples through op 0 and 10 through op 1 (40 in all); client B 10 through op 0.
    Values: A sends 1.0 everywhere, B 3.0; the previous global is 0.5.
    op 0: (30 x 1 + 10 x 3) / 40 = 1.5; op 1 (A only): 1.0; op 2 (nobody): stays 0.5;
    fixed layers (FedAvg over all examples): (40 x 1 + 10 x 3) / 50 = 1.4."""
    family = _family()
    previous = {k: torch.full(v.shape, 0.5) for k, v in family.global_model().state_dict().items()}
    shapes = {k: v.shape for k, v in previous.items()}
    counts_a = np.zeros((1, 4))
    counts_a[0, 0], counts_a[0, 1], counts_a[0, 3] = 30, 10, 0
    counts_b = np.zeros((1, 4))
    counts_b[0, 0] = 10
    a = opa_update(_update(0, 1.0, 40, shapes), family, counts_a)
    b = opa_update(_update(1, 3.0, 10, shapes), family, counts_b)
    assert not any(k.startswith("layers.0.2.") for k in a.values)  # an op held but unused is not uploaded
    assert not any(k.startswith("layers.0.1.") for k in b.values)
    reducer = MaskedWeightedMean()
    partial_a: dict = {}
    partial_b: dict = {}
    reducer.accumulate(partial_a, a, shapes)  # on two hosts, merged in host order: sharded reduction
    reducer.accumulate(partial_b, b, shapes)
    new, coverage = reducer.finalize(reducer.merge([partial_a, partial_b]), previous)
    for name, tensor in new.items():
        if name.startswith("layers.0.0."):
            expected = 1.5
        elif name.startswith("layers.0.1."):
            expected = 1.0
        elif name.startswith("layers.0.2."):
            expected = 0.5
            assert coverage[name] == 0.0
        else:
            expected = 1.4
        assert torch.allclose(tensor, torch.full_like(tensor, expected), atol=0, rtol=1e-7), name
    assert any(n.startswith("layers.0.2.") for n in new) and any(n.startswith("stem.") for n in new)


def test_supernet_costs_match_the_real_path_model() -> None:
    """A path's parameters and FLOPs from the family's cost pieces equal the realised model's."""
    from torch.utils.flop_counter import FlopCounterMode

    from rayfl.fl.methods.fedoras.algorithm import op_tables
    from rayfl.fl.methods.fedoras.sampling import path_flops
    from rayfl.models.elastic.cost import CostModel

    cfg = SupernetConfig(stem_channels=4, blocks_per_stage=(2, 1))
    family = SupernetFamily(cfg, in_channels=3, num_classes=10, image_size=8)
    tables = op_tables(family, CostModel(family, 4, use_disk_cache=False))
    assert tables.params.shape == (3, 9) and tables.params[:, family.identity].tolist() == [0.0, 0.0, 0.0]
    path = np.array([1, 8, 6])
    model = family.build(family.units_of_path(path))
    counter = FlopCounterMode(display=False)
    with counter:
        model(torch.randn(1, 3, 8, 8))
    params = sum(p.numel() for p in model.parameters())
    assert tables.fixed_params + tables.params[np.arange(3), path].sum() == params
    assert path_flops(tables, path)[0] == counter.get_total_flops()
    # a subspace model holds exactly the ops of its units and needs a path when a layer holds several
    sub = family.build(family.units_of_mask(np.ones((3, 9), dtype=bool)))
    assert sum(p.numel() for p in sub.parameters()) == tables.subspace_params(np.ones((3, 9), dtype=bool))


def test_official_mbconv_structure_params_and_flops_by_hand() -> None:
    """The official MBConv (``mbconv: official``, the default): full 3x3 conv c -> E c, BN, ReLU, SE, pointwise
    E c -> c, BN. mb3_e2 at 4 channels (hidden 8) on an 8x8 map (stem 4, one block, 8x8 images): parameters by hand
    3x3x4x8 = 288, BN 16, SE 2 x (8x8 + 8) = 144, projection 8x4 = 32, BN 8: 488; forward FLOPs per sample
    (2 per multiply-add, convolutions only, as the cost model's counter): 2 x 9 x 4 x 8 x 64 = 36,864 for the
    expansion, 2 x (2 x 8 x 8) = 256 for the SE's two 1x1 convs on the pooled 1x1 map, 2 x 8 x 4 x 64 = 4,096 for the
    projection: 41,216. The cost model's tables (each op alone minus the empty model) give exactly these."""
    from torch import nn

    from rayfl.fl.methods.fedoras.algorithm import op_tables
    from rayfl.models.elastic.cost import CostModel
    from rayfl.models.supernet import SqueezeExcite

    cfg = SupernetConfig(stem_channels=4, blocks_per_stage=(1,), ops=("mb3_e2", "identity"))
    assert cfg.mbconv == "official"
    family = SupernetFamily(cfg, in_channels=3, num_classes=10, image_size=8)
    model = family.build(family.units_of_path(np.array([0])))
    op = model.layers[0]["0"]
    kinds = [type(m) for m in op]
    assert kinds == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU, SqueezeExcite, nn.Conv2d, nn.BatchNorm2d]
    expand, project = op[0], op[4]
    assert (expand.in_channels, expand.out_channels, expand.kernel_size, expand.groups) == (4, 8, (3, 3), 1)
    assert (project.in_channels, project.out_channels, project.kernel_size) == (8, 4, (1, 1))
    assert sum(p.numel() for p in op.parameters()) == 488
    tables = op_tables(family, CostModel(family, 4, use_disk_cache=False))
    assert tables.params[0, 0] == 488.0
    assert tables.flops[0, 0] == 2 * 9 * 4 * 8 * 64 + 2 * (2 * 8 * 8) + 2 * 8 * 4 * 64 == 41_216
    # the separable form, kept as a named option: pointwise 4 -> 8, then depthwise 3x3
    separable = SupernetFamily(
        dataclasses.replace(cfg, mbconv="separable"), in_channels=3, num_classes=10, image_size=8
    )
    sep_tables = op_tables(separable, CostModel(separable, 4, use_disk_cache=False))
    assert sep_tables.params[0, 0] == 320.0
    assert sep_tables.flops[0, 0] == 2 * 4 * 8 * 64 + 2 * 9 * 8 * 64 + 2 * (2 * 8 * 8) + 2 * 8 * 4 * 64


def test_mbconv_has_squeeze_excitation_and_every_stage_ends_in_a_reduction() -> None:
    """Paper 003 App. D.3: MBConv = expansion, SE, projection; a reduction after every stage, the last one too.
    Stem 4, stages of 2 and 1 blocks, x1.5: channels 4 → 6 → 9, two reductions, the head reads 9 features of a 2x2
    map (8x8 images halved twice). mb3_e2 at 4 channels (hidden 8) in its separable form, parameters by hand:
    expansion 4x8 = 32, BN 16, depthwise 8x9 = 72, BN 16, SE 2 x (8x8 + 8) = 144, projection 8x4 = 32, BN 8: 320."""
    from rayfl.fl.methods.fedoras.algorithm import op_tables
    from rayfl.models.elastic.cost import CostModel
    from rayfl.models.supernet import SqueezeExcite

    cfg = SupernetConfig(stem_channels=4, blocks_per_stage=(2, 1), mbconv="separable")
    family = SupernetFamily(cfg, in_channels=3, num_classes=10, image_size=8)
    assert family.channels == [4, 6, 9]
    model = family.build(family.units_of_path(np.array([7, 8, 8])))  # mb3_e2, identity, identity
    assert len(model.reductions) == 2 and model.head.in_features == 9
    assert any(isinstance(m, SqueezeExcite) for m in model.modules())
    seen: list[tuple[int, ...]] = []
    model.head.register_forward_hook(lambda _m, args, _out: seen.append(tuple(args[0].shape)))
    model.reductions[1].register_forward_hook(lambda _m, _args, out: seen.append(tuple(out.shape)))
    model(torch.randn(2, 3, 8, 8))
    assert seen == [(2, 9, 2, 2), (2, 9)]
    tables = op_tables(family, CostModel(family, 4, use_disk_cache=False))
    assert tables.params[0, family.op_names.index("mb3_e2")] == 320.0
    assert tables.params[0, family.op_names.index("ds3_e2")] == 4 * 9 + 8 + 4 * 8 + 16 + 8 * 4 + 8  # no SE
