"""Several global models in one run: how their parameters share the server state's one flat ``Params`` dict.

Model 0 keeps its ``state_dict`` names; model ``k > 0`` stores each tensor under ``m{k}/<name>``. Names of
``state_dict`` entries never contain ``/``, so the prefix is unambiguous. One flat dict keeps everything the engine does
per tensor (sharding over parameter servers, the reducer's element-wise mean, checkpoints) working for any number of
models, and leaves a single-model run's names, shard plan and numbers exactly as they were. An element that no client
of this round covered keeps its value, so a model nobody trained this round is unchanged by the reduction.

The architectures live beside the parameters in ``ServerState.models`` (index = model id); a client host builds any of
them from its ``ModelConfig``. Multi-model methods (FedTrans, FedHeN's Decouple baseline, FedorAS's per-tier
fine-tuning) use these helpers instead of spelling the prefix themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from rayfl.config.model import ModelConfig
from rayfl.core.messages import Params, ServerState
from rayfl.core.rng import derive_seed
from rayfl.models import InputSpec, build_model

__all__ = [
    "add_model",
    "initial_model_params",
    "model_key",
    "model_of_key",
    "model_params",
    "num_models",
    "split_key",
    "with_model_params",
]

_SEP = "/"


def model_key(model_id: int, name: str) -> str:
    """The flat-dict name of tensor ``name`` of model ``model_id``."""
    if model_id < 0:
        raise ValueError(f"model_id must be >= 0, got {model_id}")
    return name if model_id == 0 else f"m{model_id}{_SEP}{name}"


def split_key(key: str) -> tuple[int, str]:
    """``(model id, tensor name)`` of a flat-dict name (the inverse of ``model_key``)."""
    head, sep, rest = key.partition(_SEP)
    if sep and head.startswith("m") and head[1:].isdigit():
        return int(head[1:]), rest
    return 0, key


def model_of_key(key: str) -> int:
    return split_key(key)[0]


def model_params(params: Mapping[str, torch.Tensor], model_id: int) -> Params:
    """Model ``model_id``'s tensors under their own ``state_dict`` names."""
    out: Params = {}
    for key, tensor in params.items():
        k, name = split_key(key)
        if k == model_id:
            out[name] = tensor
    return out


def with_model_params(params: Mapping[str, torch.Tensor], model_id: int, new: Mapping[str, torch.Tensor]) -> Params:
    """``params`` with model ``model_id``'s tensors replaced by ``new`` (keyed by their own names)."""
    out = {k: v for k, v in params.items() if model_of_key(k) != model_id}
    out.update({model_key(model_id, name): v for name, v in new.items()})
    return out


def num_models(state: ServerState) -> int:
    """How many global models the state holds (1 for a single-model run)."""
    return max(1, len(state.models))


def add_model(state: ServerState, config: ModelConfig, params: Mapping[str, torch.Tensor]) -> ServerState:
    """The state with one more global model (architecture ``config``, weights ``params`` under their own names) at
    the next id. ``state.models`` must already list the existing models (a method that adds models sets it up in
    ``init_state``)."""
    if not state.models:
        raise ValueError("add_model: state.models is empty; list model 0's architecture in init_state first")
    model_id = len(state.models)
    return dataclasses.replace(
        state,
        params=with_model_params(state.params, model_id, params),
        models=(*state.models, config),
    )


def initial_model_params(config: ModelConfig, spec: InputSpec, seed: int, model_id: int) -> Params:
    """Freshly initialised weights of model ``model_id``: model 0 from the same generator as the run's initial model
    (``engine/build.py``), the others from ``(seed, "init", model_id)``."""
    init_seed = derive_seed(seed, "init") if model_id == 0 else derive_seed(seed, "init", model_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        model = build_model(config, spec)
    return {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
