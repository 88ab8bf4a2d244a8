"""Users' own models: ``model.name: custom`` with ``factory: "package.module:function"``.

The factory is imported by path wherever a model is built (the driver, every client host), so its module must be
importable there (on ``PYTHONPATH``, or an installed package). It returns an ``nn.Module`` whose forward takes the
batch ``rayfl.models.to_input`` makes (``float32 [B, C, H, W]`` images, ``int64 [B, T]`` tokens) and returns logits
``[B, num_classes]``. Such a model is fixed: full-model methods (FedAvg and the methods that train the whole model)
use it; sub-model methods need an ``ElasticFamily`` (README, "Your own model with sub-model methods").
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from rayfl.config import CustomModelConfig
from rayfl.models.inputs import InputSpec, to_input

__all__ = ["build_custom_model", "call_factory", "resolve_factory"]

_PROBE_BATCH = 2  # samples of the forward pass that checks a built model's output shape


def resolve_factory(path: str, field: str) -> Callable[..., Any]:
    """The callable ``path`` ("package.module:function", attributes may be dotted) names; ``ValueError`` names the
    config ``field`` and what is wrong."""
    module_name, sep, attr = path.partition(":")
    if not path or not sep or not module_name or not attr:
        raise ValueError(f"{field}={path!r}: expected an import path 'package.module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{field}={path!r}: cannot import module {module_name!r} ({err})") from err
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{field}={path!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise ValueError(f"{field}={path!r}: {attr!r} is a {type(target).__name__}, not a callable")
    return target  # type: ignore[no-any-return]


def call_factory(factory: Callable[..., Any], kwargs: Mapping[str, Any], offered: Mapping[str, Any], field: str) -> Any:
    """Call ``factory(**kwargs)``, adding each of ``offered`` the factory names as a parameter and ``kwargs`` does
    not set; a ``TypeError`` from a mismatched signature becomes a ``ValueError`` naming ``field``."""
    call = dict(kwargs)
    try:
        params: Mapping[str, inspect.Parameter] = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # builtins without a signature: only what the user gave
        params = {}
    for name, value in offered.items():
        if name in params and name not in call:
            call[name] = value
    try:
        return factory(**call)
    except TypeError as err:
        raise ValueError(f"{field}: calling the factory with {sorted(call)} failed: {err}") from err


def build_custom_model(cfg: CustomModelConfig, spec: InputSpec) -> nn.Module:
    """The user's model for this data, checked: an ``nn.Module`` with floating-point weights whose output on a probe
    batch is ``[batch, num_classes]`` logits."""
    factory = resolve_factory(cfg.factory, "model.factory")
    offered = {"num_classes": spec.num_classes, "input_shape": spec.sample_shape}
    model = call_factory(factory, cfg.kwargs, offered, "model.factory")
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model.factory={cfg.factory!r} returned a {type(model).__module__}.{type(model).__name__}, "
            "expected a torch.nn.Module"
        )
    if not any(p.is_floating_point() for p in model.parameters()):
        raise ValueError(f"model.factory={cfg.factory!r}: the model has no floating-point parameters to train")
    _check_output(model, cfg, spec)
    return model


def _probe(spec: InputSpec) -> torch.Tensor:
    import numpy as np

    shape = (_PROBE_BATCH, *spec.sample_shape)
    dtype = np.int64 if spec.input_kind == "tokens" else np.uint8
    return to_input(np.zeros(shape, dtype=dtype), spec)


def _check_output(model: nn.Module, cfg: CustomModelConfig, spec: InputSpec) -> None:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = model(_probe(spec))
    except Exception as err:
        raise ValueError(
            f"model.factory={cfg.factory!r}: the model's forward failed on a batch of shape "
            f"{(_PROBE_BATCH, *spec.sample_shape)} ({spec.input_kind}, as the data gives): {type(err).__name__}: {err}"
        ) from err
    finally:
        model.train(was_training)
    expected = (_PROBE_BATCH, spec.num_classes)
    if not isinstance(out, torch.Tensor):
        raise ValueError(
            f"model.factory={cfg.factory!r}: forward returned a {type(out).__name__}, expected a logits tensor of "
            f"shape {expected} (wrap models that return an output object, e.g. HuggingFace's, to return .logits)"
        )
    if tuple(out.shape) != expected or not out.is_floating_point():
        raise ValueError(
            f"model.factory={cfg.factory!r}: forward returned {out.dtype} {tuple(out.shape)}, expected floating-point "
            f"logits of shape {expected} (batch, data's num_classes)"
        )
