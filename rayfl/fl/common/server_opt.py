"""The server optimizer (``server.optimizer``): what the server does with a round's aggregate, for every method.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, "Adaptive Federated Optimization", ICLR 2021
(arXiv:2003.00295), Algorithm 2. With ``x`` the global tensor and ``a`` the round's aggregate (the reducer's
weighted mean of the client models), the pseudo-gradient has the sign of their ``Delta_t`` (the mean client delta):

    Delta = a - x
    m = beta1 m + (1 - beta1) Delta                                   (every adaptive optimizer)
    v = v + Delta^2                                                   (adagrad)
    v = v - (1 - beta2) Delta^2 sign(v - Delta^2)                     (yogi)
    v = beta2 v + (1 - beta2) Delta^2                                 (adam)
    x <- x + lr m / (sqrt(v) + tau)

with ``m`` starting at 0 and ``v`` at ``initial_accumulator`` (0 in the authors' experiments; their theory asks
``v_-1 >= tau^2``), and no bias correction (Algorithm 2 has none; the authors' Keras-based code corrected Adam's).
``sgd`` is FedAvg's server step as rayfl has always taken it, on the descent direction ``g = x - a = -Delta``
(FLSim's convention: FedAvg is SGD with lr 1): ``b = g`` in the first round, ``b = momentum b + g`` after
(heavy-ball momentum, FedAvgM: Hsu et al. 2019), ``x <- x - lr b`` (``x - lr g`` without momentum). ``sgd`` with
``lr`` 1 and no momentum adopts the aggregate itself (``x - (x - a)`` would round), so it is plain averaging bit for
bit, and the default.

Sub-models. Where the round's sub-models cover part of a tensor (``Aggregate.covered``, from the reducer's weights),
the step is element-wise: an element no client covered keeps its value and its state (``m``, ``v``, the momentum
buffer), as if the round had not happened for it ("lazy" steps, as ``fl/common/distill/shared.py``'s Adam); a tensor
no client covered at all (coverage 0) does not move. Integer tensors, and tensors whose shape the method changed
since the last step (FedTrans widening a cell), adopt the aggregate; the latter start a fresh state.

Where it sits (``server_step``). The optimizer runs first: it turns the aggregate into the new parameters, and the
method's own ``server_update`` (HeteroFL's static BN and distillation, FedTrans's transformation, FedorAS's phase
hand-over) runs on them as it would on a plain mean. So the pseudo-gradient is what the clients contributed, never
the server's own training; a method that builds on the new model (distillation) starts from the optimizer's. Under
FedBuff and FedAsync the aggregate is the staleness-weighted one (``engine/policies/buffered.py``).

State. The optimizer's tensors live in ``ServerState.opt_state`` under ``server_opt/m/<tensor>``,
``server_opt/v/<tensor>`` and ``server_opt/momentum/<tensor>``, next to the method's own keys (the distillation's
``distill/...``), so checkpoints carry them and a resumed run takes the same steps. Only tensors the global model
still holds keep a state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from rayfl.config.sections import ServerOptimizerConfig
from rayfl.core.messages import Aggregate, Params, ServerState
from rayfl.fl.api.algorithm import Algorithm

__all__ = ["DEFAULT_LR", "PREFIX", "is_plain_average", "learning_rate", "optimizer_step", "server_step"]

PREFIX = "server_opt/"
# the server lr when ``lr`` is null: sgd's plain averaging; for the adaptive ones the middle of the best server rates
# Reddi et al. report per task (log10: adam/yogi -2.5 to 0, mostly -2; adagrad -1.5 to 1, mostly -1)
DEFAULT_LR = {"sgd": 1.0, "adam": 1e-2, "yogi": 1e-2, "adagrad": 1e-1}


def learning_rate(cfg: ServerOptimizerConfig) -> float:
    return cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.name]


def is_plain_average(cfg: ServerOptimizerConfig) -> bool:
    """Whether the step adopts the aggregate as it is (sgd, lr 1, no momentum): FedAvg's plain averaging."""
    return cfg.name == "sgd" and learning_rate(cfg) == 1.0 and cfg.momentum == 0.0


def server_step(
    algorithm: Algorithm, configured: ServerOptimizerConfig, state: ServerState, round_idx: int, aggregate: Aggregate
) -> ServerState:
    """The round's server step: the optimizer the method runs with (``Algorithm.server_optimizer``: ``configured``,
    or FedAvg's alias) turns ``aggregate`` into the new parameters, then the method's ``server_update`` runs on them;
    the optimizer's state replaces its previous keys in the new state's ``opt_state``."""
    cfg = algorithm.server_optimizer(configured)
    if is_plain_average(cfg):
        return algorithm.server_update(state, round_idx, aggregate)
    params, opt_state = optimizer_step(cfg, state.params, state.opt_state, aggregate)
    new = algorithm.server_update(state, round_idx, dataclasses.replace(aggregate, params=params))
    kept = {k: v for k, v in new.opt_state.items() if not k.startswith(PREFIX)}
    held = {k: v for k, v in opt_state.items() if k.split("/", 2)[2] in new.params}  # tensors the model still has
    return dataclasses.replace(new, opt_state=kept | held)


def optimizer_step(
    cfg: ServerOptimizerConfig, params: Params, opt_state: Mapping[str, torch.Tensor], aggregate: Aggregate
) -> tuple[Params, Params]:
    """``x_{t+1}`` for every tensor of ``aggregate.params`` from ``params`` (``x_t``), and the optimizer's state
    after the step (its own keys only, see the module docstring)."""
    new_params: Params = {}
    new_state: Params = {}
    for name, target in aggregate.params.items():
        x = params.get(name)
        if x is None or not x.is_floating_point() or x.shape != target.shape:
            new_params[name] = target  # nothing to step from
            continue
        before = {
            key: opt_state[at]
            for key in _STATE_KEYS[cfg.name]
            if (at := f"{PREFIX}{key}/{name}") in opt_state and opt_state[at].shape == x.shape
        }
        if aggregate.coverage.get(name, 1.0) == 0.0:  # no client covered it: no step (the reducer kept x), no new state
            new_params[name], after = target, before
        else:
            new_params[name], after = _STEPS[cfg.name](cfg, x, target, before)
            mask = aggregate.covered.get(name)
            if mask is not None:  # uncovered elements keep their value and their state (the initial one if new)
                new_params[name] = torch.where(mask, new_params[name], x)
                after = {k: torch.where(mask, v, before.get(k, _initial(cfg, k, x))) for k, v in after.items()}
        new_state.update({f"{PREFIX}{key}/{name}": value for key, value in after.items()})
    return new_params, new_state


def _sgd(
    cfg: ServerOptimizerConfig, x: torch.Tensor, target: torch.Tensor, before: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, Params]:
    """FedAvg's step: the same operations, in the same order, as ``FedAvg.server_update`` had (bit for bit)."""
    grad = x - target  # the descent direction, -Delta
    if cfg.momentum == 0.0:
        return x - learning_rate(cfg) * grad, {}
    buf = before.get("momentum")
    # uncovered elements of a first buffer hold g = 0 exactly (the reducer kept x there), the state they start from
    buf = grad.clone() if buf is None else buf.mul(cfg.momentum).add_(grad)
    return x - learning_rate(cfg) * buf, {"momentum": buf}


def _adaptive(
    cfg: ServerOptimizerConfig, x: torch.Tensor, target: torch.Tensor, before: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, Params]:
    """Algorithm 2's step for adam, yogi and adagrad (module docstring)."""
    delta = target - x
    m = before.get("m", _initial(cfg, "m", x))
    v = before.get("v", _initial(cfg, "v", x))
    m = cfg.beta1 * m + (1.0 - cfg.beta1) * delta
    square = delta * delta
    if cfg.name == "adagrad":
        v = v + square
    elif cfg.name == "yogi":
        v = v - (1.0 - cfg.beta2) * square * torch.sign(v - square)
    else:
        v = cfg.beta2 * v + (1.0 - cfg.beta2) * square
    return x + learning_rate(cfg) * m / (torch.sqrt(v) + cfg.tau), {"m": m, "v": v}


def _initial(cfg: ServerOptimizerConfig, key: str, x: torch.Tensor) -> torch.Tensor:
    """A state tensor before the first step: ``v`` at ``initial_accumulator``, ``m`` and the momentum buffer 0."""
    return torch.full_like(x, cfg.initial_accumulator) if key == "v" else torch.zeros_like(x)


_STEPS = {"sgd": _sgd, "adam": _adaptive, "yogi": _adaptive, "adagrad": _adaptive}
_STATE_KEYS = {"sgd": ("momentum",), "adam": ("m", "v"), "yogi": ("m", "v"), "adagrad": ("m", "v")}
