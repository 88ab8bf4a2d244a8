"""Paper 004's FjORD (Algorithm 4, ``fjord004``): one batch's gradient is the client model's cross-entropy plus, for
each of the S sampled widths, cross-entropy + KL to the detached client output, checked against a hand-computed
classifier gradient and against separate sub-models built and differentiated on their own; the equal-updates knob
(``train.steps_per_batch``) counted in optimizer updates per batch. Real tiny models, nothing mocked."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest
import torch
from torch import nn

from rayfl.config.model import CNNConfig
from rayfl.core.messages import Assignment, TrainTask
from rayfl.core.rng import derive_rng
from rayfl.engine.build import Setup, bind_algorithm, build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.client import ClientContext
from rayfl.fl.api.optim import SGD, ClientOptimizer
from rayfl.fl.common.nested import NestedClient
from rayfl.fl.methods.fedavg.algorithm import FedAvg
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedrescue.algorithm import FedResCuE
from rayfl.fl.methods.fedrescue.config import FedResCuEConfig
from rayfl.fl.methods.fjord004.algorithm import FjORD004
from rayfl.fl.methods.fjord004.config import FjORD004Config
from rayfl.models.elastic.spec import first_k
from rayfl.models.inputs import to_input
from tests.helpers import tiny_config, tiny_image_dataset

CNN_BN = CNNConfig(channels=(8, 16), norm="batch")


def _cfg(algorithm: Any, **train: Any) -> ExperimentConfig:
    cfg = dataclasses.replace(tiny_config(kind="local", num_hosts=1), algorithm=algorithm, model=CNN_BN, rounds=1)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))


def _bound(algorithm: Any) -> tuple[Any, Setup]:
    cfg = _cfg(algorithm)
    setup = build_setup(cfg, tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    return setup.algorithm, setup


def _pad(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    out = torch.zeros(shape, dtype=grad.dtype)
    out[tuple(slice(0, n) for n in grad.shape)] = grad
    return out


def test_one_batch_is_ce_plus_kl_per_sampled_width_and_the_full_models_ce() -> None:
    """S = 2 widths of 1/8 ... 7/8 inside a full-capacity client: the client model's accumulated gradient equals
    (a) for the classifier weight, the hand-computed ``sum over models of dz^T features``, with ``dz`` =
    ``(softmax(z) - onehot(y)) / B`` for the client model and ``(2 softmax(z_p) - onehot(y) - softmax(z)) / B`` for a
    width p (CE + KL(teacher || student) with the teacher detached); (b) for every tensor, the client model's CE
    gradient plus each width's CE + KL gradient computed on a separate sub-model holding copies of the leading slices,
    zero-padded into the client's shapes."""
    alg, setup = _bound(FjORD004Config(num_ratios=2))
    alg = cast(FjORD004, alg)
    family = alg.require_family()
    own = family.full_units
    model = family.extract(setup.params, first_k(own))
    x, y = setup.dataset.client_train(0)
    inputs, labels = to_input(x[:8], setup.input_spec, torch.device("cpu")), torch.as_tensor(y[:8])
    batch = len(labels)
    subs = alg.sampled_units(NestedClient(own, 1.0, derive_rng(0, "batch")))
    assert len(subs) == 2 and all(u != own for u in subs)

    # the method's gradient
    task = TrainTask(client_id=0, round_idx=0, seed=0, lr=0.05, assignment=Assignment())
    ctx = ClientContext.of(task, model, setup.input_spec)
    ctx.put(NestedClient(own, 1.0, derive_rng(0, "batch")))
    model.zero_grad(set_to_none=True)
    alg.backward_step(ctx, inputs, labels)
    got = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    # (a) by hand: the classifier's gradient from the logits and the pooled features of each model
    feats: dict[str, torch.Tensor] = {}

    def features_of(module: nn.Module, key: str) -> torch.Tensor:
        handle = module.head.register_forward_hook(lambda _m, a, _o: feats.__setitem__(key, a[0].detach()))
        with torch.no_grad():
            z = module(inputs)
        handle.remove()
        return z

    z_full = features_of(model, "full").double()
    onehot = nn.functional.one_hot(labels, z_full.shape[1]).double()
    soft_t = torch.softmax(z_full, dim=1)
    expected_head = ((soft_t - onehot) / batch).T @ feats["full"].double()
    sub_models = []
    for units in subs:
        sub = family.extract({n: t.detach() for n, t in model.state_dict().items()}, first_k(units))
        sub_models.append(sub)
        z_p = features_of(sub, "sub").double()
        dz = (2 * torch.softmax(z_p, dim=1) - onehot - soft_t) / batch
        expected_head += _pad((dz.T @ feats["sub"].double()), got["head.weight"].shape).double()
    assert torch.allclose(got["head.weight"].double(), expected_head, atol=1e-5)

    # (b) every tensor, from separate modules differentiated on their own
    ref = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    clone = family.extract({n: t.detach() for n, t in model.state_dict().items()}, first_k(own))
    teacher_logits = clone(inputs)
    nn.functional.cross_entropy(teacher_logits, labels).backward()  # type: ignore[no-untyped-call]
    for n, p in clone.named_parameters():
        ref[n] += p.grad
    teacher = teacher_logits.detach()
    for sub in sub_models:
        z_p = sub(inputs)
        kl = nn.functional.kl_div(
            nn.functional.log_softmax(z_p, 1),
            nn.functional.log_softmax(teacher, 1),
            reduction="batchmean",
            log_target=True,
        )
        (nn.functional.cross_entropy(z_p, labels) + kl).backward()  # type: ignore[no-untyped-call]
        for n, p in sub.named_parameters():
            ref[n] += _pad(p.grad, ref[n].shape)
    assert got.keys() == ref.keys()
    for n in ref:
        assert torch.allclose(got[n], ref[n], atol=1e-6), n


def test_with_no_sampled_width_a_full_capacity_run_is_fedavg_bit_for_bit() -> None:
    """``num_ratios: 0``: each batch is the client model's cross-entropy alone, so at full capacity (no memory
    limits) the run equals sample-weighted FedAvg exactly."""
    data = tiny_image_dataset()
    a = run_experiment(_cfg(FjORD004Config(num_ratios=0)), write=False, dataset=data)
    b = run_experiment(_cfg(FedAvgConfig()), write=False, dataset=data)
    assert [r.train_loss for r in a.records] == [r.train_loss for r in b.records]
    assert all(torch.equal(a.state.params[k], b.state.params[k]) for k in a.state.params)


class _CountingSGD(SGD):
    """rayfl's client SGD, counting its updates (``step`` calls) into ``counts``."""

    def __init__(self, params: Any, lr: float, counts: list[int]) -> None:
        super().__init__(params, lr, momentum=0.9)
        self.counts = counts

    def step(self) -> None:
        self.counts.append(1)
        super().step()


@pytest.mark.parametrize(
    ("method", "config", "steps_per_batch", "per_batch"),
    [
        (FedAvg, FedAvgConfig(), 1, 1),
        (FedAvg, FedAvgConfig(), 2, 2),  # the equal-updates control: a one-update method given FedResCuE's two
        (FjORD004, FjORD004Config(num_ratios=2), 1, 1),  # S widths, still one summed update
        (FjORD004, FjORD004Config(num_ratios=2), 2, 2),
        # S = 2: the step of x p's columns, the step of the rest (ratio 1), then line 9's whole-model step
        (FedResCuE, FedResCuEConfig(num_ratios=2), 1, 3),
        (FedResCuE, FedResCuEConfig(num_ratios=2), 2, 6),
    ],
)
def test_steps_per_batch_multiplies_the_optimizer_updates_of_every_batch(
    method: Any, config: Any, steps_per_batch: int, per_batch: int
) -> None:
    """Counted, not assumed: a full-width client's ``local_train`` with ``train.steps_per_batch`` k runs the method's
    whole batch step k times per batch, and the optimizer's ``step`` is called ``per_batch`` times a batch
    (FedResCuE at S = 2: a progressive step per listed ratio, each on its own columns, then line 9's whole-model
    step, S + 1 in all, two of them moving any one weight; ``masked_step`` calls ``step`` once per progressive
    step)."""
    counts: list[int] = []

    class Counted(method):  # type: ignore[misc, valid-type]
        def make_optimizer(self, params: Any, lr: float) -> ClientOptimizer:
            return _CountingSGD(params, lr, counts)

    cfg = _cfg(config, steps_per_batch=steps_per_batch, batch_size=4, epochs=1)
    setup = build_setup(cfg, tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    alg = Counted(config, cfg.train)
    alg.bind_server(setup.algorithm.server)
    family = alg.require_family()
    x, y = setup.dataset.client_train(0)
    model = family.extract(setup.params, first_k(family.full_units))
    task = TrainTask(client_id=0, round_idx=0, seed=0, lr=0.05, assignment=Assignment())
    update = alg.local_train(ClientContext.of(task, model, setup.input_spec), x, y)
    batches = -(-len(y) // 4)
    assert update.num_steps == batches > 1
    assert len(counts) == per_batch * batches


def test_the_clock_prices_every_repeat_of_a_batch() -> None:
    """``steps_per_batch`` k: the samples a client processes in a round (what the clock prices) are k times as many."""
    from rayfl.config.sections import TrainConfig
    from rayfl.system.work import samples_per_round

    once = TrainConfig(epochs=2, batch_size=4, max_steps=5)
    assert samples_per_round(once, 10) == 10 + 8  # one pass, then two batches of the second
    assert samples_per_round(dataclasses.replace(once, steps_per_batch=2), 10) == 2 * 18
