"""FedResCuE (paper 004) and its baselines: progressive steps move only their new columns, Eq. 4's band-wise mean,
FedSeq = FedResCuE at alpha 0, and at p = 1 over perfect links every method is FedAvg bit for bit. Real tiny models
through the real engine; nothing mocked."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, cast

import numpy as np
import pytest
import torch

from rayfl.config.model import CNNConfig
from rayfl.config.sections import LinkConfig, ResourceConfig
from rayfl.core.messages import Assignment, ClientUpdate, TensorSlice, TrainTask
from rayfl.core.reducers import MaskedWeightedMean
from rayfl.core.rng import derive_rng
from rayfl.engine.build import Setup, bind_algorithm, build_clock, build_setup
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.nested import NestedClient, distill_loss
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedrescue.algorithm import FedResCuE
from rayfl.fl.methods.fedrescue.config import FedResCuEConfig, FedRushConfig, FedSeqConfig
from rayfl.fl.methods.fedslim.config import FedSlimConfig
from rayfl.fl.methods.fjord.config import FjORDConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.models.elastic.spec import first_k
from rayfl.models.inputs import to_input
from tests.helpers import tiny_config, tiny_image_dataset

CNN_BN = CNNConfig(channels=(8, 16), norm="batch")
CAPACITY_MEMORY = ResourceConfig(source="levels", values=(0.02, 0.035, 0.05, 1.0))  # MiB: x0.25 x0.5 x0.75 x1
FAULTY = LinkConfig(error_rate=ResourceConfig(source="uniform", low=0.1, high=0.2))
PERFECT = LinkConfig(error_rate=ResourceConfig(source="constant", low=0.0))  # links on, nothing ever lost


def _cfg(algorithm: Any, links: LinkConfig = FAULTY, memory: ResourceConfig | None = None) -> ExperimentConfig:
    cfg = dataclasses.replace(tiny_config(kind="local", num_hosts=2), algorithm=algorithm, model=CNN_BN)
    system = dataclasses.replace(cfg.system, links=links, memory=memory or ResourceConfig())
    return dataclasses.replace(cfg, system=system)


def _run(cfg: ExperimentConfig) -> RunResult:
    return run_experiment(cfg, write=False, dataset=tiny_image_dataset())


def _same(a: RunResult, b: RunResult) -> bool:
    keys = ("train_loss", "test_acc", "test_loss", "bytes_down", "bytes_up", "clients_failed")
    if [[getattr(r, k) for k in keys] for r in a.records] != [[getattr(r, k) for k in keys] for r in b.records]:
        return False
    return all(torch.equal(a.state.params[k], b.state.params[k]) for k in a.state.params)


def _bound(alpha: float = 1.0) -> tuple[FedResCuE, Setup]:
    cfg = _cfg(FedResCuEConfig(alpha=alpha))
    setup = build_setup(cfg, tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    return cast(FedResCuE, setup.algorithm), setup


def _context(model: torch.nn.Module, own: tuple[int, ...], setup: Setup, rng_key: str = "test") -> ClientContext:
    """A full-width client's context on ``model``, its ratio generator drawn from ``rng_key`` (what
    ``NestedWidthAlgorithm.local_train`` puts there before the batch hooks run)."""
    task = TrainTask(client_id=0, round_idx=0, seed=0, lr=0.05, assignment=Assignment())
    ctx = ClientContext.of(task, model, setup.input_spec)
    ctx.put(NestedClient(own, 1.0, derive_rng(0, rng_key)))
    return ctx


def _block(shape: torch.Size, sub: tuple[int, ...]) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[tuple(slice(0, n) for n in sub)] = True
    return mask


def _state_of(opt: Any, i: int, p: torch.nn.Parameter) -> dict[str, torch.Tensor]:
    """Clones of parameter ``i``'s per-element optimizer state (momentum buffer or Adam's moments)."""
    if isinstance(opt, torch.optim.Optimizer):
        return {k: v.clone() for k, v in opt.state[p].items() if v.shape == p.shape}
    return {k: v.clone() for k, v in opt.tensor_state(i).items()}


@pytest.mark.parametrize("kind", ["sgd", "torch-sgd", "adam"])
def test_each_progressive_step_moves_only_the_columns_its_ratio_adds(kind: str) -> None:
    """After one ordinary step (so every element has momentum), step x0.25 (from nothing) moves only the 0.25 block
    and step x0.5 after it only the 0.5 block minus the 0.25 block. Every other element's parameter AND optimizer
    state (SGD's momentum buffer, Adam's two moments) stays bit-identical, not decayed (the frozen elements are out of
    the step, as torch.optim leaves a parameter without a gradient), with momentum 0.9 and weight decay 0.01; inside
    the new columns both moved."""
    from rayfl.fl.api.optim import client_optimizer

    alg, setup = _bound()
    family = alg.require_family()
    own = family.full_units
    model = family.extract(setup.params, first_k(own))
    params = list(model.parameters())
    x, y = setup.dataset.client_train(0)
    inputs, labels = to_input(x[:8], setup.input_spec, torch.device("cpu")), torch.as_tensor(y[:8])
    opt: Any = (
        torch.optim.SGD(params, lr=0.5, momentum=0.9, weight_decay=0.01)
        if kind == "torch-sgd"
        else client_optimizer(kind, params, 0.5 if kind == "sgd" else 0.01, momentum=0.9, weight_decay=0.01)
    )
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), labels).backward()  # type: ignore[no-untyped-call]
    opt.step()  # every element now carries optimizer state
    ctx = _context(model, own, setup)
    with torch.no_grad():
        teacher = alg.nested.logits(model, inputs)
    quarter, half = alg.uniform_units(0.25), alg.uniform_units(0.5)
    previous: tuple[int, ...] | None = None
    for units in (quarter, half):
        before = [(p.detach().clone(), _state_of(opt, i, p)) for i, p in enumerate(params)]
        alg._progressive_step(ctx, inputs, labels, units, previous, teacher, 1.0, opt, params)
        moved_any = False
        for i, (name, p) in enumerate(model.named_parameters()):
            new = _block(p.shape, family.space.sub_shape(name, units))
            if previous is not None:
                new &= ~_block(p.shape, family.space.sub_shape(name, previous))
            old, old_state = before[i]
            state = _state_of(opt, i, p)
            assert state.keys() == old_state.keys() and state, (units, name)
            assert torch.equal(p.detach()[~new], old[~new]), (units, name)
            for key, value in state.items():
                assert torch.equal(value[~new], old_state[key][~new]), (units, name, key)
                moved_any |= bool(new.any()) and not torch.equal(value[new], old_state[key][new])
            moved_any |= not torch.equal(p.detach()[new], old[new])
        assert moved_any, units
        previous = units


def test_a_progressive_step_clips_the_norm_of_the_new_columns_gradient() -> None:
    """With ``grad_clip_norm`` c and plain SGD (lr 1, no momentum) a progressive step x0.5 after x0.25 moves the new
    columns by exactly -g * min(1, c / |g|), g the gradient of J restricted to those columns (an oracle on a copy):
    the frozen columns' gradient neither moves anything nor counts in the norm."""
    alg, setup = _bound()
    alg.train = dataclasses.replace(alg.train, grad_clip_norm=0.05, momentum=0.0, weight_decay=0.0)
    family = alg.require_family()
    own = family.full_units
    model = family.extract(setup.params, first_k(own))
    x, y = setup.dataset.client_train(0)
    inputs, labels = to_input(x[:8], setup.input_spec, torch.device("cpu")), torch.as_tensor(y[:8])
    quarter, half = alg.uniform_units(0.25), alg.uniform_units(0.5)
    ctx = _context(model, own, setup)
    with torch.no_grad():
        teacher = alg.nested.logits(model, inputs)
    oracle = family.extract(setup.params, first_k(own))
    logits = alg.nested.sub_forward(family, oracle, half)(inputs)
    loss = alg.nested.cross_entropy(logits, inputs, labels) + distill_loss(logits, teacher)
    grads = torch.autograd.grad(loss, list(oracle.parameters()))
    new = {
        name: _block(p.shape, family.space.sub_shape(name, half))
        & ~_block(p.shape, family.space.sub_shape(name, quarter))
        for name, p in oracle.named_parameters()
    }
    g = {
        name: torch.where(new[name], grad, 0.0)
        for (name, _), grad in zip(oracle.named_parameters(), grads, strict=True)
    }
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(v) for v in g.values()])))
    assert norm > 0.05  # the clip binds
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    params = list(model.parameters())
    alg._progressive_step(ctx, inputs, labels, half, quarter, teacher, 1.0, alg.make_optimizer(params, 1.0), params)
    for name, p in model.named_parameters():
        expected = before[name] - g[name] * (0.05 / (norm + 1e-6))  # clip_grad_norm_'s scale
        assert torch.allclose(p.detach(), expected, rtol=1e-5, atol=1e-7), name
        assert torch.equal(p.detach()[~new[name]], before[name][~new[name]]), name


def test_ratio_lists_are_ordered_distinct_and_end_at_one() -> None:
    alg, _ = _bound()
    rng = derive_rng(0, "test")
    lists = [alg.nested.ratio_list(rng) for _ in range(200)]
    assert all(len(r) == 4 and r[-1] == 1.0 and r == sorted(set(r)) for r in lists)
    assert len({tuple(r) for r in lists}) > 10  # S - 1 = 3 of the 7 ratios below 1, drawn afresh per batch
    client = NestedClient(alg.uniform_units(0.5), 0.5, derive_rng(0, "units"))
    units = alg.nested.unit_list(alg.require_family(), client)
    assert units[-1] == client.own and all(a != b for a, b in itertools.pairwise(units))


def test_band_wise_mean_over_the_clients_whose_upload_covers_each_band() -> None:
    """Eq. 4 on a 4x4 tensor with bands of 1 (x0.25), 2, 3 and 4 leading rows and columns: client A uploads x0.5
    (value 1), B x0.75 (value 4), C x1 (value 10). Band 1-2 = (1 + 4 + 10) / 3, band 3 = (4 + 10) / 2, band 4 = 10;
    the count, not the samples, normalises (unequal sample counts)."""
    reducer = MaskedWeightedMean()
    partial: dict[str, Any] = {}
    shapes = {"w": torch.Size([4, 4])}
    for k, value, samples in ((2, 1.0, 10), (3, 4.0, 30), (4, 10.0, 50)):
        idx = np.arange(k)
        update = ClientUpdate(0, 1.0, {"w": torch.full((k, k), value)}, {"w": TensorSlice((idx, idx))}, samples, 0, 1)
        reducer.accumulate(partial, update, shapes)
    new, _ = reducer.finalize(reducer.merge([partial]), {"w": torch.full((4, 4), -1.0)})
    expected = torch.full((4, 4), 10.0)
    expected[:3, :3] = 7.0
    expected[:2, :2] = 5.0
    assert torch.equal(new["w"], expected)
    alg, _ = _bound()
    assert alg.client_weight(10) == alg.client_weight(50) == 1.0


def test_fedseq_is_fedrescue_without_distillation() -> None:
    memory = CAPACITY_MEMORY
    seq = _run(_cfg(FedSeqConfig(), memory=memory))
    assert _same(seq, _run(_cfg(FedResCuEConfig(alpha=0.0), memory=memory)))
    assert not _same(seq, _run(_cfg(FedResCuEConfig(alpha=1.0), memory=memory)))
    assert not _same(seq, _run(_cfg(FedRushConfig(alpha=0.0), memory=memory)))  # freezing matters


@pytest.mark.parametrize(
    ("method", "weighting"),
    [
        (FedResCuEConfig(capacities=(1.0,), ratios=(1.0,)), "uniform"),
        (FedSeqConfig(capacities=(1.0,), ratios=(1.0,)), "uniform"),
        (FedRushConfig(capacities=(1.0,), ratios=(1.0,)), "uniform"),
        (FedSlimConfig(capacities=(1.0,), ratios=(1.0,)), "samples"),
        (
            HeteroFLConfig(rates=(1.0,), label_mask=False, static_bn=False, official_init=False, grad_clip_norm=None),
            "uniform",
        ),
        (FjORDConfig(widths=(1.0,)), "samples"),
    ],
    ids=["fedrescue", "fedseq", "fedrush", "fedslim", "heterofl", "fjord"],
)
def test_at_full_width_over_perfect_links_every_method_is_fedavg(method: Any, weighting: str) -> None:
    """Links on (error rate 0, padding, per-client memories kept) and every client at x1: FedAvg bit for bit."""
    fedavg = _run(_cfg(FedAvgConfig(weighting=weighting), links=LinkConfig()))  # type: ignore[arg-type]
    assert _same(_run(_cfg(method, links=PERFECT)), fedavg)


@pytest.mark.parametrize("distill", [True, False], ids=["paper-kd", "slimmable-ce"])
def test_fedslim_sums_the_gradients_of_the_sampled_widths_into_one_step(distill: bool) -> None:
    """FedSlim's batch gradient = the whole model's cross-entropy gradient plus, for every smaller listed width,
    the gradient of KL(the whole model's detached logits || the width's) (paper 004's Algorithm 3, the default) or of
    its cross-entropy (``kd: false``), each computed on a separately extracted sub-model and placed on its
    leading block (an independent oracle: real sub-models, no shared views)."""
    from rayfl.fl.methods.fedslim.algorithm import FedSlim

    cfg = _cfg(FedSlimConfig(kd=distill))
    setup = build_setup(cfg, tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    alg = cast(FedSlim, setup.algorithm)
    family = alg.require_family()
    own = family.full_units
    model = family.extract(setup.params, first_k(own))
    x, y = setup.dataset.client_train(1)
    inputs, labels = to_input(x[:8], setup.input_spec, torch.device("cpu")), torch.as_tensor(y[:8])
    widths = alg.nested.unit_list(family, NestedClient(own, 1.0, derive_rng(0, "slim")))
    assert len(widths) == 4 and widths[-1] == own
    ctx = _context(model, own, setup, rng_key="slim")
    model.zero_grad()
    alg.backward_step(ctx, inputs, labels)
    expected = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
    teacher = family.extract(setup.params, first_k(own))(inputs).detach()
    for units in widths:
        sub = family.extract(setup.params, first_k(units))
        logits = sub(inputs)
        if units != own and distill:
            target = torch.log_softmax(teacher, dim=1)
            loss = torch.sum(target.exp() * (target - torch.log_softmax(logits, dim=1))) / len(labels)
        else:
            loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()  # type: ignore[no-untyped-call]
        for name, p in sub.named_parameters():
            assert p.grad is not None
            expected[name][tuple(slice(0, n) for n in p.shape)] += p.grad
    for name, p in model.named_parameters():
        assert p.grad is not None
        assert torch.allclose(p.grad, expected[name], atol=1e-6, rtol=1e-5), name


def test_clients_csv_records_what_each_link_delivered(tmp_path: Any) -> None:
    import csv

    cfg = dataclasses.replace(_cfg(FedResCuEConfig(), memory=CAPACITY_MEMORY), output_dir=str(tmp_path))
    result = run_experiment(cfg, write=True, dataset=tiny_image_dataset())
    assert result.run_dir is not None
    with (result.run_dir / "clients.csv").open() as f:
        rows = list(csv.DictReader(f))
    down = [float(r["p_down"]) for r in rows]
    up = [float(r["p_up"]) for r in rows]
    assert all(0.0 <= d <= 1.0 for d in down) and all(0.0 <= u <= 1.0 for u in up)
    assert any(d < 1.0 for d in down) and any(u == 0.0 for u in up)
    assert all(r["failure"] == "link_up" for r, u in zip(rows, up, strict=True) if u == 0.0)


def test_each_width_is_recorded_every_evaluated_round_with_a_trace_of_error_rates() -> None:
    """``eval_widths`` records the accuracy of each x p sub-model every evaluated round (x1 is the main evaluation);
    the error rate comes from a trace read by round (``traces/link-error-rounds.csv``: er 0 in rounds 0-3, so the
    first rounds move every byte of the whole capacities); bytes moved are in the round records."""
    trace = ResourceConfig(source="trace", file="traces/link-error-rounds.csv", offset="zero")
    links = LinkConfig(error_rate=trace, trace_time="round")
    cfg = dataclasses.replace(_cfg(FedResCuEConfig(), links=links), eval_widths=(0.25, 0.5, 1.0), rounds=2)
    result = _run(cfg)
    names = ["x0.25", "x0.5", "x1"]
    assert [(e.round_idx, e.name) for e in result.evals] == [(r, n) for r in (0, 1) for n in names]
    for record in result.records:
        accs = {e.name: e.test_acc for e in result.evals if e.round_idx == record.round_idx}
        assert accs["x1"] == record.test_acc and all(0.0 <= a <= 1.0 for a in accs.values())
        assert record.bytes_down == record.bytes_up > 0 and record.clients_failed == 0
    perfect = _run(dataclasses.replace(cfg, system=dataclasses.replace(cfg.system, links=PERFECT)))
    assert _same(result, perfect)  # er 0 from the trace = links that never lose a column


def test_eval_widths_outside_0_1_are_refused_naming_the_item(tmp_path: Any) -> None:
    from rayfl.core.errors import ConfigError
    from rayfl.experiment.loader import load_config

    path = tmp_path / "widths.yaml"
    path.write_text("eval_widths: [0.5, 1.5]\n")
    with pytest.raises(ConfigError, match=r"widths.yaml:1: eval_widths\[1\]: must lie in \(0, 1\], got 1.5"):
        load_config(path)
