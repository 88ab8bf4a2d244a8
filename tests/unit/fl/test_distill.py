"""Federated in-place distillation (paper 000, Algorithm 1, Eq. 2) with real training of tiny ResNet and CharBert
families: oracle tests of the shared-weights update against hand-computed gradients and ``torch.optim.Adam``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rayfl.config.model import CharBertConfig, ResNetConfig
from rayfl.core.messages import Params
from rayfl.core.rng import derive_rng, derive_torch_generator
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.common.distill.kd import copy_noise_generator, model_logits, noise_source
from rayfl.fl.common.distill.server import (
    OPT_KEYS,
    allowed_ratios,
    distillation_gap,
    inplace_distill,
    kd_loss,
    load_sub_model,
    merge_copies,
    sample_structures,
)
from rayfl.fl.common.distill.shared import SharedDistillation, lazy_adam_step
from rayfl.models.elastic import CharBertFamily, ElasticFamily, ResNetFamily
from rayfl.models.elastic.bert import ElasticCharBert
from rayfl.models.elastic.spec import first_k
from rayfl.models.inputs import InputSpec

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
        ("resnet", IMAGES, 0.0, DistillConfig(enabled=True, iterations=20, batch_size=16, update="shared"), 3),
        ("resnet", IMAGES, 0.0, DistillConfig(enabled=True, iterations=20, batch_size=16, update="copies"), 3),
        ("bert", TOKENS, 0.3, DistillConfig(enabled=True, iterations=30, batch_size=16, lr=3e-3, update="shared"), 4),
        ("bert", TOKENS, 0.3, DistillConfig(enabled=True, iterations=30, batch_size=16, update="copies"), 4),
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
    new = inplace_distill(family, params, cfg, S, num_subnets=n, seed=0, round_idx=0, input_spec=spec).params
    after = distillation_gap(family, new, structures, input_spec=spec, batch_size=64, seed=5)
    assert before > 0.0
    assert after < 0.85 * before
    if cfg.update == "shared":
        # Eq. (2) moves the shared weights, the teacher's included; sub-nets it did not train may drift either way
        # (measured: the tiny ResNet's gap to 4 other sub-nets x1.01 here, x1.2 after 40 steps; copies: x0.8, x0.6)
        return
    # the copies variant lowers the gap on sub-nets it never trained too (other structures of the same space)
    others = sample_structures(family.space, S, 4, derive_rng(9, "other"))
    fresh_before = distillation_gap(family, params, others, input_spec=spec, batch_size=64, seed=6)
    fresh_after = distillation_gap(family, new, others, input_spec=spec, batch_size=64, seed=6)
    assert fresh_after < fresh_before


def test_zero_iterations_or_sub_nets_leave_the_global_params_and_optimizer_state_bit_for_bit(
    bert: CharBertFamily,
) -> None:
    params = global_params(bert, 0.3)
    kept = {k: torch.full((3,), 0.5) for k in OPT_KEYS}
    for update in ("shared", "copies"):
        for iterations, n in ((0, 4), (3, 0)):
            cfg = DistillConfig(enabled=True, iterations=iterations, update=update, optimizer_state="run")  # type: ignore[arg-type]
            out = inplace_distill(
                bert, params, cfg, S, num_subnets=n, seed=0, round_idx=0, input_spec=TOKENS, opt_state=kept
            )
            assert out.params.keys() == params.keys()
            for name, value in params.items():
                assert torch.equal(out.params[name], value), name
            assert out.opt_state.keys() == kept.keys()
            assert all(torch.equal(out.opt_state[k], kept[k]) for k in OPT_KEYS)


@pytest.mark.parametrize("update", ["shared", "copies"])
def test_distillation_is_reproducible_from_the_seed_and_leaves_the_global_rng_alone(
    bert: CharBertFamily, update: str
) -> None:
    params = global_params(bert, 0.3)
    cfg = DistillConfig(enabled=True, iterations=4, batch_size=8, update=update)  # type: ignore[arg-type]

    def run(seed: int, round_idx: int) -> Params:
        out = inplace_distill(bert, params, cfg, S, num_subnets=3, seed=seed, round_idx=round_idx, input_spec=TOKENS)
        return out.params

    state = torch.random.get_rng_state()
    a = run(0, 2)
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(123)  # the global generator does not matter
    b = run(0, 2)
    for name in params:
        assert torch.equal(a[name], b[name]), name
    assert any(not torch.equal(a[k], c) for k, c in run(0, 3).items())
    assert any(not torch.equal(a[k], c) for k, c in run(1, 2).items())


@pytest.mark.parametrize("update", ["shared", "copies"])
def test_uncovered_elements_and_embeddings_keep_their_values_covered_ones_change(
    bert: CharBertFamily, update: str
) -> None:
    params = global_params(bert, 0.3)
    cfg = DistillConfig(enabled=True, iterations=3, batch_size=8, update=update)  # type: ignore[arg-type]
    n, seed, round_idx = 2, 4, 7
    structures = sample_structures(bert.space, S, n, derive_rng(seed, "distill", round_idx))
    new = inplace_distill(bert, params, cfg, S, num_subnets=n, seed=seed, round_idx=round_idx, input_spec=TOKENS).params
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


# ------------------------------------------------------------------ Eq. (2) against a hand computation
def hand_gradient(
    family: ElasticFamily,
    weights: Params,
    structures: list[tuple[int, ...]],
    batches: list[torch.Tensor],
    tokens: bool,
    teacher_weights: Params | None = None,
) -> Params:
    """Eq. (2) the slow way: each sub-net extracted as a separate model, the teacher the global model at
    ``weights`` (or ``teacher_weights``), each sub-net's gradient scattered to its global positions, the sum divided
    by the number of sub-nets holding each element (0 where none does)."""
    total = {k: torch.zeros_like(v) for k, v in weights.items()}
    count = {k: torch.zeros_like(v) for k, v in weights.items()}
    with torch.random.fork_rng(devices=[]):
        teacher = family.extract(teacher_weights or weights, first_k(family.full_units)).eval()
        for units, x in zip(structures, batches, strict=True):
            student = family.extract(weights, first_k(units)).train()
            with torch.no_grad():
                soft = model_logits(teacher, x, tokens)
            kd_loss(model_logits(student, x, tokens), soft, 1.0).backward()  # type: ignore[no-untyped-call]
            slices = family.slices(first_k(units))
            for name, p in student.named_parameters():
                index = slices[name].torch_index(tuple(total[name].shape))
                count[name][index] += 1.0
                if p.grad is not None:
                    total[name][index] += p.grad
    return {k: torch.where(count[k] > 0, total[k] / count[k].clamp(min=1.0), 0.0) for k in total}


def adam_steps(params: Params, grads: list[Params], lr: float) -> Params:
    """``torch.optim.Adam`` on the global tensors, one step per gradient in ``grads``."""
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.Adam(list(leaves.values()), lr=lr)
    for grad in grads:
        for k, leaf in leaves.items():
            leaf.grad = grad[k].clone()
        opt.step()
    return {k: v.detach() for k, v in leaves.items()}


@pytest.mark.parametrize(("which", "spec", "perturb"), [("resnet", IMAGES, 0.0), ("bert", TOKENS, 0.3)])
def test_one_iteration_is_an_adam_step_with_the_sub_nets_mean_gradient_on_the_shared_weights(
    request: pytest.FixtureRequest, which: str, spec: InputSpec, perturb: float
) -> None:
    family: ElasticFamily = request.getfixturevalue(which)
    params = global_params(family, perturb)
    tokens = spec.input_kind == "tokens"
    cfg = DistillConfig(enabled=True, iterations=1, batch_size=8, lr=0.01, update="shared")
    n, seed, round_idx = 3, 0, 1
    structures = sample_structures(family.space, S, n, derive_rng(seed, "distill", round_idx))
    assert len(set(structures)) == n and any(0 in s for s in structures)  # distinct sub-nets, a skipped block
    run = SharedDistillation(family, params, cfg, structures, input_spec=spec, opt_state={})
    batches = [run.noise_source.draw(copy_noise_generator(seed, round_idx, i)) for i in range(n)]
    grad = run.named(run.gradient(batches))
    expected = hand_gradient(family, params, structures, batches, tokens)
    trained = grad.keys()
    assert any(float(expected[k].abs().max()) > 0.0 for k in trained)
    for name in trained:
        torch.testing.assert_close(grad[name], expected[name], rtol=1e-4, atol=1e-6, msg=name)
    # inplace_distill with T_SKD = 1 draws the same structures and noise and takes that one Adam step
    out = inplace_distill(family, params, cfg, S, num_subnets=n, seed=seed, round_idx=round_idx, input_spec=spec)
    stepped = adam_steps({k: params[k] for k in trained}, [expected], cfg.lr)
    for name in trained:
        torch.testing.assert_close(out.params[name], stepped[name], rtol=0.0, atol=cfg.lr * 1e-3, msg=name)
    assert out.opt_state == {}  # optimizer_state: round keeps nothing
    # the SGD ablation: the same mean gradient, a step of lr times it (uncovered elements: a zero gradient)
    sgd = dataclasses.replace(cfg, optimizer="sgd", lr=0.5)
    out = inplace_distill(family, params, sgd, S, num_subnets=n, seed=seed, round_idx=round_idx, input_spec=spec)
    for name in trained:
        want = params[name] - sgd.lr * expected[name]
        torch.testing.assert_close(out.params[name], want, rtol=1e-4, atol=1e-6, msg=name)


def test_the_teacher_is_the_global_model_of_the_previous_iteration(resnet: ResNetFamily) -> None:
    params = global_params(resnet)
    cfg = DistillConfig(enabled=True, iterations=2, batch_size=8, lr=0.05, update="shared")
    structures = sample_structures(resnet.space, S, 2, derive_rng(0, "distill", 0))
    run = SharedDistillation(resnet, params, cfg, structures, input_spec=IMAGES, opt_state={})
    gen = derive_torch_generator(0, "x")
    run.step(run.gradient([run.noise_source.draw(gen) for _ in structures]))
    moved, _ = run.result()
    batches = [run.noise_source.draw(gen) for _ in structures]
    second = run.named(run.gradient(batches))
    fresh = hand_gradient(resnet, moved, structures, batches, tokens=False)  # teacher W^1, as the students
    frozen = hand_gradient(resnet, moved, structures, batches, tokens=False, teacher_weights=params)  # teacher W^0
    assert max(float((fresh[k] - frozen[k]).abs().max()) for k in second) > 1e-3  # the check can tell them apart
    for name in second:
        torch.testing.assert_close(second[name], fresh[name], rtol=1e-4, atol=1e-6, msg=name)
    # the ablation teacher: round freezes it at the aggregated model W^0
    ablation = SharedDistillation(
        resnet, params, dataclasses.replace(cfg, teacher="round"), structures, input_spec=IMAGES, opt_state={}
    )
    gen = derive_torch_generator(0, "x")
    ablation.step(ablation.gradient([ablation.noise_source.draw(gen) for _ in structures]))
    assert all(torch.equal(ablation.result()[0][k], moved[k]) for k in moved)  # the same first step
    second_round = ablation.named(ablation.gradient(batches))
    for name in second_round:
        torch.testing.assert_close(second_round[name], frozen[name], rtol=1e-4, atol=1e-6, msg=name)


def test_lazy_adam_equals_torch_adam_on_covered_elements_and_leaves_the_rest_with_their_moments() -> None:
    gen = derive_torch_generator(0, "adam")
    param = torch.randn(6, generator=gen)
    covered = torch.tensor([True, True, True, True, False, False])
    state = {k: torch.zeros(6) for k in OPT_KEYS}
    grads = [torch.randn(6, generator=gen) for _ in range(3)]
    expected = adam_steps({"p": param[:4]}, [{"p": g[:4]} for g in grads], lr=0.1)["p"]
    out = param.clone()
    for g in grads:
        lazy_adam_step(out, torch.where(covered, g, 0.0), covered, state, lr=0.1)
    torch.testing.assert_close(out[:4], expected, rtol=1e-5, atol=1e-6)  # float32 rounding of the formula
    assert torch.equal(out[4:], param[4:])
    assert state["distill/steps"].tolist() == [3, 3, 3, 3, 0, 0]
    # kept across rounds: an element that the next round does not cover keeps its value and its moments
    before = {k: v.clone() for k, v in state.items()}
    only_first = torch.tensor([True, False, False, False, False, False])
    lazy_adam_step(out, grads[0], only_first, state, lr=0.1)
    for k in OPT_KEYS:
        assert torch.equal(state[k][1:], before[k][1:]) and not torch.equal(state[k][:1], before[k][:1])


def test_optimizer_state_run_is_returned_and_continued_the_next_round(resnet: ResNetFamily) -> None:
    params = global_params(resnet)
    kw = {"enabled": True, "iterations": 2, "batch_size": 8, "update": "shared"}
    run_cfg = DistillConfig(**kw, optimizer_state="run")  # type: ignore[arg-type]
    first = inplace_distill(resnet, params, run_cfg, S, num_subnets=2, seed=0, round_idx=0, input_spec=IMAGES)
    numel = sum(v.numel() for v in params.values())
    assert sorted(first.opt_state) == sorted(OPT_KEYS)
    assert all(v.numel() == numel for v in first.opt_state.values())
    structures = sample_structures(resnet.space, S, 2, derive_rng(0, "distill", 0))
    mask = torch.cat([m.reshape(-1) for m in covered(resnet, structures, params).values()])
    assert torch.equal(first.opt_state["distill/steps"], 2.0 * mask.float())
    # round 1 from round 0's state differs from round 1 with a fresh Adam, and counts on
    args = {"num_subnets": 2, "seed": 0, "round_idx": 1, "input_spec": IMAGES}
    kept = inplace_distill(resnet, first.params, run_cfg, S, opt_state=first.opt_state, **args)  # type: ignore[arg-type]
    fresh = inplace_distill(resnet, first.params, DistillConfig(**kw), S, opt_state=first.opt_state, **args)  # type: ignore[arg-type]
    assert fresh.opt_state == {}
    assert any(not torch.equal(kept.params[k], fresh.params[k]) for k in params)
    assert float(kept.opt_state["distill/steps"].max()) == 4.0


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


@pytest.mark.parametrize("temperature", [1.0, 2.5, 0.5])
def test_kd_loss_is_t_squared_kl_of_teacher_from_student_averaged_over_rows(temperature: float) -> None:
    """The closed form, computed in float64 from the definition without torch's softmax or KL: per row,
    ``T^2 * sum_c p_c (log p_c - log q_c)`` with ``p = softmax(teacher / T)`` and ``q = softmax(student / T)``, then the
    mean over every leading position (a token model's (batch, positions, classes) logits count each position)."""
    gen = np.random.default_rng(7)
    student = gen.normal(scale=3.0, size=(4, 5, 6))
    teacher = gen.normal(scale=3.0, size=(4, 5, 6))

    def probs(z: np.ndarray) -> np.ndarray:
        e = np.exp(z / temperature - (z / temperature).max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    p, q = probs(teacher), probs(student)
    want = temperature**2 * float((p * (np.log(p) - np.log(q))).sum(axis=-1).mean())
    got = kd_loss(torch.tensor(student, dtype=torch.float64), torch.tensor(teacher, dtype=torch.float64), temperature)
    assert float(got) == pytest.approx(want, rel=1e-10)
    rows = kd_loss(torch.tensor(student[0]), torch.tensor(teacher[0]), temperature)  # 2-D: the mean over rows
    assert float(rows) == pytest.approx(temperature**2 * float((p[0] * np.log(p[0] / q[0])).sum(axis=-1).mean()))
    assert float(kd_loss(torch.tensor(teacher), torch.tensor(teacher), temperature)) == pytest.approx(0.0, abs=1e-12)
    # the direction: KL(teacher || student), not KL(student || teacher)
    reverse = temperature**2 * float((q * (np.log(q) - np.log(p))).sum(axis=-1).mean())
    assert abs(want - reverse) > 1e-3 and float(got) != pytest.approx(reverse, rel=1e-6)


# ------------------------------------------------------------------ issue 40: Algorithm 1 as the default
def quadrant_images(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised 8x8 noise images whose labelled quadrant (of four) is brighter: a task the tiny ResNet learns."""
    x = torch.randn(n, 3, 8, 8, generator=gen)
    y = torch.randint(0, 4, (n,), generator=gen)
    for label, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        x[y == label, :, r * 4 : r * 4 + 4, c * 4 : c * 4 + 4] += 1.5
    return x, y


def trained_params(family: ElasticFamily) -> tuple[Params, torch.Tensor, torch.Tensor]:
    """The family's global model trained (full width, SGD) on quadrant images: its parameters and a test set."""
    gen = derive_torch_generator(0, "quadrants")
    x, y = quadrant_images(512, gen)
    x_test, y_test = quadrant_images(256, gen)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = family.global_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model.train()
        for _epoch in range(4):
            for i in range(0, len(x), 32):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x[i : i + 32]), y[i : i + 32]).backward()  # type: ignore[no-untyped-call]
                opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, x_test, y_test


def logit_spread(family: ElasticFamily, params: Params, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """The global model's accuracy on ``x`` and its logits' standard deviation over the inputs (mean over classes)."""
    model = load_sub_model(family, params, family.full_units).eval()
    with torch.no_grad():
        logits = model(x)
    return float((logits.argmax(1) == y).float().mean()), float(logits.std(0).mean())


def test_the_default_distillation_keeps_a_trained_models_output_dependent_on_its_input(resnet: ResNetFamily) -> None:
    """Issue 40: with the shipped default of the time (``update: shared``) one round took a model at 22 % to a
    constant output (the logits' spread over inputs 0.203 -> 0.001). The default now (``copies``, the paper's values
    T_SKD = 100, K = 64, Adam 1e-3) keeps at least a quarter of the spread, and the model above its baseline."""
    assert DistillConfig().update == "copies"
    params, x, y = trained_params(resnet)
    acc, spread = logit_spread(resnet, params, x, y)
    baseline = float(torch.bincount(y).max()) / len(y)
    assert acc >= baseline + 0.25, (acc, baseline)  # a model that learned (measured 0.99 against 0.28)
    cfg = DistillConfig(enabled=True)
    assert (cfg.iterations, cfg.batch_size, cfg.lr) == (100, 64, 1e-3)
    new = inplace_distill(resnet, params, cfg, S, num_subnets=4, seed=0, round_idx=0, input_spec=IMAGES).params
    acc_after, spread_after = logit_spread(resnet, new, x, y)
    print(
        f"trained {acc:.3f} (baseline {baseline:.3f}), spread {spread:.3f}; "
        f"distilled {acc_after:.3f}, {spread_after:.3f}"
    )
    assert spread_after >= spread / 4, (spread, spread_after, acc, acc_after)
    # measured: copies keeps the spread at 3.51 of 4.03 and the accuracy at 1.00; shared (the old default) 2.18 and
    # 0.73 in this round, a drop this assertion catches
    assert acc_after >= acc - 0.1, (acc, acc_after, spread, spread_after)


def test_the_copies_update_is_the_element_wise_mean_of_the_sub_nets_worked_by_hand(resnet: ResNetFamily) -> None:
    """Two hand-built sub-nets, every weight of A = 1 and of B = 3, the global model at 10: an element both hold
    becomes 2, one only B holds 3, one neither holds stays 10."""
    full = resnet.full_units
    a = (1, 0, *full[2:])  # stem of 1 channel, first block of stage 0 skipped
    b = (3, 2, *full[2:])  # stem of 3 channels, first block's middle of 2
    params = {k: torch.full_like(v, 10.0) for k, v in global_params(resnet).items()}
    students = [load_sub_model(resnet, params, units) for units in (a, b)]
    for student, value in zip(students, (1.0, 3.0), strict=True):
        with torch.no_grad():
            for t in student.state_dict().values():
                t.fill_(value)
    merged = merge_copies(resnet, params, [a, b], students)
    stem = merged["conv1.weight"]  # [4, 3, 3, 3]: output channel 0 in both, 1-2 in B only, 3 in neither
    assert stem[0].eq(2.0).all() and stem[1:3].eq(3.0).all() and stem[3].eq(10.0).all()
    assert merged["layers.0.0.n1.weight"].tolist() == [3.0, 3.0, 3.0, 10.0]  # A skips the block it belongs to
    assert merged["layers.0.1.n1.weight"].tolist() == [2.0, 3.0, 3.0, 10.0]  # the next block: both hold it
    mid = merged["layers.0.0.conv1.weight"]  # [4 mid, 4 stem, 3, 3]: only B holds it, rows 0-1 x columns 0-2
    assert mid[:2, :3].eq(3.0).all()
    assert mid[2:].eq(10.0).all() and mid[:, 3].eq(10.0).all()
    # a tensor both hold whole (the last stage, full width in both) is their plain mean
    assert merged["linear.weight"].eq(2.0).all() and merged["linear.bias"].eq(2.0).all()


def test_token_noise_has_the_embedding_outputs_statistics_over_random_tokens(bert: CharBertFamily) -> None:
    """``distill.noise: embedding`` (default): Gaussian hidden states whose mean at each position and dimension and
    whose standard deviation per dimension are those of the model's embedding output over uniformly random tokens;
    ``tokens``: uniformly random token ids; ``unit``: N(0, 1)."""
    params = global_params(bert, 0.3)
    model = load_sub_model(bert, params, bert.full_units).eval()
    assert isinstance(model, ElasticCharBert)
    gen = derive_torch_generator(0, "tokens-stats")
    # the embedding output of real (uniformly random) token sequences, measured by running the embedding
    ids = torch.randint(0, 12, (20000, 8), generator=gen)
    with torch.no_grad():
        real = model.tok_embed(ids) + model.pos_embed
    source = noise_source(model, TOKENS, 20000, "embedding")
    drawn = source.draw(derive_torch_generator(1, "noise"))
    assert drawn.shape == (20000, 8, 16) and drawn.dtype == torch.float32
    torch.testing.assert_close(drawn.mean(0), real.mean(0), atol=0.05, rtol=0.0)
    torch.testing.assert_close(drawn.std(0), real.std(0), atol=0.05, rtol=0.05)
    assert float(real.std()) < 0.6  # far from the N(0, 1) that was drawn there before
    tokens = noise_source(model, TOKENS, 64, "tokens").draw(gen)
    assert tokens.shape == (64, 8) and tokens.dtype == torch.int64 and 0 <= int(tokens.min()) <= int(tokens.max()) < 12
    unit = noise_source(model, TOKENS, 4000, "unit").draw(gen)
    assert abs(float(unit.mean())) < 0.02 and abs(float(unit.std()) - 1.0) < 0.02
    # images: N(0, 1) in the normalised input space, whatever the mode
    image = noise_source(load_sub_model(bert, params, bert.full_units), IMAGES, 2, "tokens")
    assert image.kind == "images" and image.draw(gen).shape == (2, 3, 8, 8)


@pytest.mark.parametrize("noise", ["tokens", "unit"])
def test_the_token_noise_ablations_distil(bert: CharBertFamily, noise: str) -> None:
    """Random token sequences go through the embedding (which then learns too); ``unit`` leaves it alone."""
    params = global_params(bert, 0.3)
    cfg = DistillConfig(enabled=True, iterations=3, batch_size=8, noise=noise)  # type: ignore[arg-type]
    new = inplace_distill(bert, params, cfg, S, num_subnets=2, seed=0, round_idx=0, input_spec=TOKENS).params
    assert torch.equal(new["tok_embed.weight"], params["tok_embed.weight"]) == (noise == "unit")
    assert not torch.equal(new["decoder.weight"], params["decoder.weight"])


def test_the_data_control_feeds_training_samples_as_the_clients_see_them(resnet: ResNetFamily) -> None:
    """``distill.noise: data`` (issue 40's control on real inputs): each batch is ``K`` rows of the pool, drawn from
    the copy's generator and converted by ``to_input`` as a client converts them; without a pool it is refused, and
    the copies it trains differ from the noise-trained ones (the inputs reach the update)."""
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, size=(50, 3, 8, 8), dtype=np.uint8)
    spec = dataclasses.replace(IMAGES, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    params = global_params(resnet)
    model = load_sub_model(resnet, params, resnet.full_units)
    source = noise_source(model, spec, 6, "data", pool)
    batch = source.draw(derive_torch_generator(3, "data"))
    rows = np.sort(torch.randint(0, 50, (6,), generator=derive_torch_generator(3, "data")).numpy())
    expected = (torch.from_numpy(pool[rows]).float() / 255.0 - 0.5) / 0.25
    torch.testing.assert_close(batch, expected)
    tokens = np.arange(40, dtype=np.int64).reshape(5, 8) % 12
    ids = noise_source(model, TOKENS, 4, "data", tokens).draw(derive_torch_generator(0, "t"))
    assert ids.dtype == torch.int64 and ids.shape == (4, 8)
    with pytest.raises(ValueError, match=r"distill\.noise: data"):
        noise_source(model, spec, 6, "data")
    cfg = DistillConfig(enabled=True, iterations=2, batch_size=4, update="copies")
    kw = {"num_subnets": 2, "seed": 0, "round_idx": 0, "input_spec": spec}
    on_data = inplace_distill(resnet, params, dataclasses.replace(cfg, noise="data"), S, pool=pool, **kw).params
    on_noise = inplace_distill(resnet, params, cfg, S, **kw).params
    again = inplace_distill(resnet, params, dataclasses.replace(cfg, noise="data"), S, pool=pool, **kw).params
    assert all(torch.equal(on_data[k], again[k]) for k in params)
    assert any(not torch.equal(on_data[k], on_noise[k]) for k in params)


@pytest.mark.parametrize("norm", ["bn", "gn"])
def test_copies_give_the_same_weights_bit_for_bit_whatever_the_number_of_workers(norm: str) -> None:
    """Issue 40 item 3: the copies train at the same time on ``distill.workers`` threads; each copy reads only its own
    noise generator and runs on one intra-op thread, so 1, 2 or 3 workers (and the caller's thread count) give the
    same merged weights, and neither the caller's threads nor its global generator change."""
    family = ResNetFamily(
        ResNetConfig(depth=18, widths=(4, 8, 8, 8), norm=norm), in_channels=3, num_classes=4, image_size=8
    )
    params = global_params(family)
    base = DistillConfig(enabled=True, iterations=3, batch_size=8, update="copies")
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    outs = {}
    for workers in (1, 2, 3):
        torch.set_num_threads(1 + workers % 2)
        cfg = dataclasses.replace(base, workers=workers)
        outs[workers] = inplace_distill(
            family, params, cfg, S, num_subnets=3, seed=5, round_idx=1, input_spec=IMAGES
        ).params
        assert torch.get_num_threads() == 1 + workers % 2
    torch.set_num_threads(threads)
    assert torch.equal(torch.random.get_rng_state(), rng)
    changed = [k for k in params if not torch.equal(outs[1][k], params[k])]
    assert changed, "the distillation changed no weight"
    for workers in (2, 3):
        differ = [k for k in params if not torch.equal(outs[1][k], outs[workers][k])]
        assert not differ, f"workers={workers} differs from workers=1 in {differ}"


def test_copies_of_a_model_with_dropout_run_one_at_a_time_and_are_reproducible() -> None:
    """Dropout reads the process-wide generator: such a model's copies run one after another whatever
    ``distill.workers`` says, each with its own dropout seed, and the caller's generator is left as it was."""
    family = CharBertFamily(
        CharBertConfig(size="mini", act="relu6", dropout=0.2),
        vocab_size=12,
        seq_len=8,
        embed_dim=16,
        depth=2,
        heads=2,
        head_dim=8,
        mlp_dim=32,
    )
    params = global_params(family, 0.3)
    cfg = DistillConfig(enabled=True, iterations=3, batch_size=8, update="copies", workers=4)
    rng = torch.random.get_rng_state()
    a = inplace_distill(family, params, cfg, S, num_subnets=3, seed=0, round_idx=2, input_spec=TOKENS).params
    assert torch.equal(torch.random.get_rng_state(), rng)
    torch.manual_seed(99)
    b = inplace_distill(
        family, params, dataclasses.replace(cfg, workers=1), S, num_subnets=3, seed=0, round_idx=2, input_spec=TOKENS
    ).params
    assert all(torch.equal(a[k], b[k]) for k in params)
    assert any(not torch.equal(a[k], params[k]) for k in params)


def test_distillation_on_cuda_without_a_gpu_is_one_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/gpu covers distill.device: cuda")
    family = ResNetFamily(
        ResNetConfig(depth=18, widths=(4, 8, 8, 8), norm="gn"), in_channels=3, num_classes=4, image_size=8
    )
    cfg = DistillConfig(enabled=True, iterations=1, batch_size=4, device="cuda")
    with pytest.raises(RuntimeError, match=r"distill\.device is 'cuda'"):
        inplace_distill(family, global_params(family), cfg, S, num_subnets=2, seed=0, round_idx=0, input_spec=IMAGES)


def test_a_run_that_distils_on_cuda_is_refused_before_round_0_where_the_driver_sees_no_gpu() -> None:
    from rayfl.core.errors import ConfigError
    from rayfl.engine.preflight import check_distill_device
    from rayfl.experiment.loader import load_config

    cfg = load_config(None, ["algorithm.name=model_search", "algorithm.distill.enabled=true"])
    check_distill_device(cfg, cuda_available=False)  # the default, cpu, needs nothing
    gpu = load_config(
        None, ["algorithm.name=model_search", "algorithm.distill.enabled=true", "algorithm.distill.device=cuda"]
    )
    check_distill_device(gpu, cuda_available=True)
    with pytest.raises(ConfigError, match=r"algorithm\.distill\.device: 'cuda' distils on the driver's GPU"):
        check_distill_device(gpu, cuda_available=False)
    off = load_config(None, ["algorithm.name=model_search", "algorithm.distill.device=cuda"])
    check_distill_device(off, cuda_available=False)  # no distillation: the setting is unused
