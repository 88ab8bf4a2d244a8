"""Federated in-place distillation (paper 000, Algorithm 1) with real training of tiny ResNet and CharBert families."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfl.algorithms.distill import (
    allowed_ratios,
    distillation_gap,
    inplace_distill,
    load_sub_model,
    sample_structures,
)
from rayfl.algorithms.payloads import Params
from rayfl.algorithms.submodel import first_k
from rayfl.config import CharBertConfig, DistillConfig, ResNetConfig
from rayfl.models.elastic import CharBertFamily, ElasticFamily, ResNetFamily
from rayfl.models.elastic.bert import ElasticCharBert
from rayfl.models.inputs import InputSpec
from rayfl.rng import derive_rng, derive_torch_generator

S = (0.0, 0.5, 1.0)
IMAGES = InputSpec("image", 4, (3, 8, 8))
TOKENS = InputSpec("tokens", 12, (8,))


@pytest.fixture(scope="module")
def resnet() -> ResNetFamily:
    # GroupNorm: CPU batch norm has a slow first call per shape, and the sub-nets have many shapes
    return ResNetFamily(
        ResNetConfig(depth=18, widths=(4, 8, 8, 8), norm="gn", act="relu6"), in_channels=3, num_classes=4, image_size=8
    )


@pytest.fixture(scope="module")
def bert() -> CharBertFamily:
    cfg = CharBertConfig(size="mini", act="relu6")
    return CharBertFamily(cfg, vocab_size=12, seq_len=8, embed_dim=16, depth=2, heads=2, head_dim=8, mlp_dim=32)


def global_params(family: ElasticFamily, perturb: float = 0.0) -> Params:
    """Seeded initial weights, optionally plus N(0, perturb) noise (a freshly initialised CharBert predicts nearly
    uniform characters at every width, so there would be nothing to distil)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = family.global_model()
    gen = derive_torch_generator(1, "perturb")
    return {k: v.detach() + perturb * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def covered(family: ElasticFamily, structures: list[tuple[int, ...]], params: Params) -> dict[str, torch.Tensor]:
    mask = {k: torch.zeros(v.shape, dtype=torch.bool) for k, v in params.items()}
    for units in structures:
        for name, tslice in family.slices(first_k(units)).items():
            mask[name][tslice.torch_index(tuple(params[name].shape))] = True
    return mask


@pytest.mark.parametrize(
    ("which", "spec", "perturb", "cfg", "n"),
    [
        ("resnet", IMAGES, 0.0, DistillConfig(enabled=True, iterations=20, batch_size=16), 3),
        ("bert", TOKENS, 0.3, DistillConfig(enabled=True, iterations=30, batch_size=16), 4),
    ],
)
def test_distillation_lowers_the_gap_between_global_model_and_sub_nets_on_fresh_noise(
    request: pytest.FixtureRequest, which: str, spec: InputSpec, perturb: float, cfg: DistillConfig, n: int
) -> None:
    family: ElasticFamily = request.getfixturevalue(which)
    params = global_params(family, perturb)
    structures = sample_structures(family.space, S, n, derive_rng(0, "distill", 0))  # the sub-nets it trains
    assert any(0 in s for s in structures)  # skipped blocks are exercised
    # fresh noise: another generator than the training noise, and a larger batch
    before = distillation_gap(family, params, structures, input_spec=spec, batch_size=64, seed=5)
    new = inplace_distill(family, params, cfg, S, num_subnets=n, seed=0, round_idx=0, input_spec=spec)
    after = distillation_gap(family, new, structures, input_spec=spec, batch_size=64, seed=5)
    assert before > 0.0
    assert after < 0.85 * before
    # and on sub-nets it never trained (other structures of the same space)
    others = sample_structures(family.space, S, 4, derive_rng(9, "other"))
    fresh_before = distillation_gap(family, params, others, input_spec=spec, batch_size=64, seed=6)
    fresh_after = distillation_gap(family, new, others, input_spec=spec, batch_size=64, seed=6)
    assert fresh_after < fresh_before


def test_zero_iterations_or_sub_nets_leave_the_global_params_bit_for_bit(bert: CharBertFamily) -> None:
    params = global_params(bert, 0.3)
    for cfg, n in ((DistillConfig(enabled=True, iterations=0), 4), (DistillConfig(enabled=True, iterations=3), 0)):
        new = inplace_distill(bert, params, cfg, S, num_subnets=n, seed=0, round_idx=0, input_spec=TOKENS)
        assert new.keys() == params.keys()
        for name, value in params.items():
            assert torch.equal(new[name], value), name


def test_distillation_is_reproducible_from_the_seed_and_leaves_the_global_rng_alone(bert: CharBertFamily) -> None:
    params = global_params(bert, 0.3)
    cfg = DistillConfig(enabled=True, iterations=4, batch_size=8)

    def run(seed: int, round_idx: int) -> Params:
        return inplace_distill(bert, params, cfg, S, num_subnets=3, seed=seed, round_idx=round_idx, input_spec=TOKENS)

    state = torch.random.get_rng_state()
    a = run(0, 2)
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(123)  # the global generator does not matter
    b = run(0, 2)
    for name in params:
        assert torch.equal(a[name], b[name]), name
    assert any(not torch.equal(a[k], c) for k, c in run(0, 3).items())
    assert any(not torch.equal(a[k], c) for k, c in run(1, 2).items())


def test_merge_keeps_uncovered_elements_and_changes_covered_ones(bert: CharBertFamily) -> None:
    params = global_params(bert, 0.3)
    cfg = DistillConfig(enabled=True, iterations=3, batch_size=8)
    n, seed, round_idx = 2, 4, 7
    structures = sample_structures(bert.space, S, n, derive_rng(seed, "distill", round_idx))
    new = inplace_distill(bert, params, cfg, S, num_subnets=n, seed=seed, round_idx=round_idx, input_spec=TOKENS)
    mask = covered(bert, structures, params)
    assert any(not bool(m.all()) for m in mask.values())  # something stays uncovered
    for name, value in params.items():
        assert new[name].dtype == value.dtype
        assert torch.equal(new[name][~mask[name]], value[~mask[name]]), name
    # the noise enters after the embeddings: they get no gradient and keep their values
    for name in ("tok_embed.weight", "pos_embed"):
        assert torch.equal(new[name], params[name])
    changed = [name for name in params if not torch.equal(new[name][mask[name]], params[name][mask[name]])]
    assert "decoder.weight" in changed and any(name.startswith("blocks.") for name in changed)


def test_structures_draw_each_dimension_uniformly_from_its_allowed_ratios(resnet: ResNetFamily) -> None:
    space = resnet.space
    allowed = allowed_ratios(space, S)
    units = np.array(sample_structures(space, S, 3000, derive_rng(0, "x")))
    for d, dim in enumerate(space.dims):
        values, counts = np.unique(units[:, d], return_counts=True)
        options = sorted({0 if r == 0 else max(1, int(np.ceil(r * dim.size - 1e-9))) for r in allowed[d]})
        assert values.tolist() == options, dim.name
        assert (0 in values) == dim.skippable
        assert counts.min() > 3000 / len(options) * 0.85  # uniform over the allowed ratios
        assert values.max() == dim.size
    with pytest.raises(ValueError, match="ratios"):
        allowed_ratios(space, (0.0,))
    with pytest.raises(ValueError, match="ratios"):
        allowed_ratios(space, (0.5, 1.5))


def test_sub_nets_are_first_k_extractions_and_charbert_runs_from_hidden_states(
    resnet: ResNetFamily, bert: CharBertFamily
) -> None:
    for family in (resnet, bert):
        params = global_params(family, 0.1)
        (units,) = sample_structures(family.space, S, 1, derive_rng(3, "x"))
        ours = load_sub_model(family, params, units).state_dict()
        with torch.random.fork_rng(devices=[]):
            reference = family.extract(params, first_k(units)).state_dict()
        assert ours.keys() == reference.keys()
        for name in ours:
            assert torch.equal(ours[name], reference[name]), name
    model = load_sub_model(bert, global_params(bert, 0.3), bert.full_units).eval()
    assert isinstance(model, ElasticCharBert)
    x = torch.randint(0, 12, (3, 8), generator=derive_torch_generator(0, "tokens"))
    h = model.tok_embed(x) + model.pos_embed
    torch.testing.assert_close(model.forward_hidden(h, all_positions=True), model(x, all_positions=True))
    torch.testing.assert_close(model.forward_hidden(h), model(x))
