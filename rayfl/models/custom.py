"""Users' own models: ``model.name: custom`` with ``factory: "package.module:function"``.

The factory is imported by path wherever a model is built (the driver, every client host): from an installed
package, ``PYTHONPATH``, or the working directory, which ``resolve_factory`` puts first on ``sys.path`` as
``python -m`` does (the ``rayfl`` console script does not: its ``sys.path[0]`` is its own folder). A Ray host
resolves from the driver's working directory, which comes with the run (``search_from``), so a package in the folder
``rayfl run`` was started from resolves the same on every host, wherever the Ray instance was started. Every fault is
a ``ConfigError`` on ``model.factory`` (or ``data.factory``) naming the path and what is wrong with it or with what it
returned.

The factory returns an ``nn.Module`` whose forward takes the batch ``rayfl.models.to_input`` makes (``float32
[B, C, H, W]`` images, ``int64 [B, T]`` tokens, ``float32 [B, F]`` feature vectors) and returns logits
``[B, num_classes]``. Such a model is fixed:
full-model methods (FedAvg and the methods that train the whole model) use it; sub-model methods need an
``ElasticFamily`` (docs/models.md, "Your own model with sub-model methods").
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from rayfl.config.model import CustomModelConfig
from rayfl.core.errors import ConfigError
from rayfl.models.inputs import InputSpec, to_input

__all__ = [
    "build_custom_model",
    "call_factory",
    "check_model_factory",
    "check_model_output",
    "resolve_factory",
    "search_from",
]

_PROBE_BATCH = 2  # samples of the forward pass that checks a built model's output shape


def resolve_factory(path: str, field: str) -> Callable[..., Any]:
    """The callable ``path`` ("package.module:function", attributes may be dotted) names, imported with the working
    directory first on ``sys.path``; a ``ConfigError`` on ``field`` names the path and what is wrong."""
    module_name, sep, attr = path.partition(":")
    if not path or not sep or not module_name or not attr:
        raise ConfigError(f"{path!r}: expected an import path 'package.module:function'", field)
    _working_directory_first()
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as err:  # not found, or the module's own code failed (SyntaxError, an import it lacks ...)
        reason = str(err) if isinstance(err, ImportError) else f"{type(err).__name__}: {err}"
        where = f" from {_search_dir or os.getcwd()}" if isinstance(err, ModuleNotFoundError) else ""
        raise ConfigError(f"{path!r}: cannot import module {module_name!r}{where} ({reason})", field) from err
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"{path!r}: module {module_name!r} has no attribute {attr!r}", field) from None
    if not callable(target):
        raise ConfigError(f"{path!r}: {attr!r} is a {type(target).__name__}, not a callable", field)
    return target  # type: ignore[no-any-return]


def search_from(directory: str | None) -> None:
    """Resolve import paths from ``directory`` first (``None``: the working directory). A Ray host is given the
    driver's working directory: its own is the one its Ray instance started in, which may be another (a notebook that
    changed directory, a cluster, warm actors of an earlier run)."""
    global _search_dir
    _search_dir = directory


_search_dir: str | None = None


def _working_directory_first() -> None:
    """The working directory (or ``search_from``'s) first on ``sys.path``, as ``python -m`` and Ray's workers have
    it. Kept there afterwards: a factory's module may import its siblings later, when it is called."""
    first = _search_dir or os.getcwd()
    if sys.path[:1] != [first] and not (sys.path[:1] == [""] and first == os.getcwd()):
        with contextlib.suppress(ValueError):
            sys.path.remove(first)
        sys.path.insert(0, first)
        importlib.invalidate_caches()


def call_factory(factory: Callable[..., Any], kwargs: Mapping[str, Any], offered: Mapping[str, Any], field: str) -> Any:
    """Call ``factory(**kwargs)``, adding each of ``offered`` the factory names as a parameter and ``kwargs`` does
    not set; a mismatched signature, or any exception the factory raises, is a ``ConfigError`` on ``field`` (the
    exception chained to it, for a traceback from Python)."""
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
    except ConfigError:
        raise
    except TypeError as err:
        raise ConfigError(f"calling {_name(factory)} with {sorted(call)} failed: {err}", field) from err
    except Exception as err:
        raise ConfigError(f"{_name(factory)} raised {type(err).__name__}: {err}", field) from err


def _name(factory: Callable[..., Any]) -> str:
    """``'module:qualname'`` of a factory, as an import path names it."""
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    return repr(f"{module}:{name}") if module and name else repr(factory)


def build_custom_model(cfg: CustomModelConfig, spec: InputSpec) -> nn.Module:
    """The user's model for this data, checked: an ``nn.Module`` with floating-point weights whose output on a probe
    batch is ``[batch, num_classes]`` logits."""
    model = _module_of(cfg, {"num_classes": spec.num_classes, "input_shape": spec.sample_shape})
    _check_output(model, cfg, spec)
    return model


def check_model_factory(cfg: CustomModelConfig, input_kind: str | None) -> nn.Module:
    """What ``rayfl validate`` can check without the data: the factory imports, is callable and returns an
    ``nn.Module`` with floating-point weights, built on the meta device (no memory for weights, no initialisation)
    and given stand-ins for what the data decides (``num_classes`` 10, an ``input_shape`` of ``input_kind``, image when
    unknown). The run checks the forward's output against the real data."""
    shape = {"tokens": (32,), "features": (16,)}.get(input_kind or "", (3, 32, 32))
    offered = {"num_classes": 10, "input_shape": shape}
    try:
        with torch.device("meta"):
            return _module_of(cfg, offered)
    except ConfigError as err:
        if err.__cause__ is None or isinstance(err.__cause__, TypeError | ImportError):
            raise  # a wrong path, signature or returned type: the meta device has no part in it
        return _module_of(cfg, offered)  # the factory failed on the meta device (it reads a weight, say): on the CPU


def check_model_output(cfg: CustomModelConfig, spec: InputSpec) -> None:
    """What ``rayfl validate`` checks once a table's metadata gives the input and the class count (``spec``): the
    model built for them returns ``[batch, num_classes]`` logits, built and run on the meta device (no weights
    allocated, nothing computed); a factory or forward the meta device cannot run is built and probed on the CPU."""
    offered = {"num_classes": spec.num_classes, "input_shape": spec.sample_shape}
    probe = _probe(spec).to("meta")
    try:
        with torch.device("meta"):
            model = _module_of(cfg, offered)
            model.eval()
            with torch.no_grad():
                out = model(probe)
    except ConfigError as err:
        if err.__cause__ is None or isinstance(err.__cause__, TypeError | ImportError):
            raise
        build_custom_model(cfg, spec)
        return
    except Exception:  # an operation without a meta kernel, say: the CPU says what is wrong, if anything
        build_custom_model(cfg, spec)
        return
    expected = (_PROBE_BATCH, spec.num_classes)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected or not out.is_floating_point():
        build_custom_model(cfg, spec)  # the CPU build and probe: its one-line refusal names the shapes


def _module_of(cfg: CustomModelConfig, offered: Mapping[str, Any]) -> nn.Module:
    factory = resolve_factory(cfg.factory, "model.factory")
    model = call_factory(factory, cfg.kwargs, offered, "model.factory")
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"{cfg.factory!r} returned a {type(model).__module__}.{type(model).__name__}, expected a torch.nn.Module",
            "model.factory",
        )
    if not any(p.is_floating_point() for p in model.parameters()):
        raise ConfigError(f"{cfg.factory!r}: the model has no floating-point parameters to train", "model.factory")
    return model


def _probe(spec: InputSpec) -> torch.Tensor:
    import numpy as np

    shape = (_PROBE_BATCH, *spec.sample_shape)
    dtype = {"tokens": np.int64, "features": np.float32}.get(spec.input_kind, np.uint8)
    return to_input(np.zeros(shape, dtype=dtype), spec)


def _check_output(model: nn.Module, cfg: CustomModelConfig, spec: InputSpec) -> None:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = model(_probe(spec))
    except Exception as err:
        raise ConfigError(
            f"{cfg.factory!r}: the model's forward failed on a batch of shape {(_PROBE_BATCH, *spec.sample_shape)} "
            f"({spec.input_kind}, as the data gives): {type(err).__name__}: {err}",
            "model.factory",
        ) from err
    finally:
        model.train(was_training)
    expected = (_PROBE_BATCH, spec.num_classes)
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            f"{cfg.factory!r}: forward returned a {type(out).__name__}, expected a logits tensor of shape {expected} "
            "(wrap models that return an output object, e.g. HuggingFace's, to return .logits)",
            "model.factory",
        )
    if tuple(out.shape) != expected or not out.is_floating_point():
        raise ConfigError(
            f"{cfg.factory!r}: forward returned {out.dtype} {tuple(out.shape)}, expected floating-point logits of "
            f"shape {expected} (batch, data's num_classes)",
            "model.factory",
        )
