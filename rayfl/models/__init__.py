"""Model families. ``build_model`` is the one entry point; the table below is the full list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from rayfl.config.model import (
    CellNetConfig,
    CharBertConfig,
    CharLSTMConfig,
    CharTransformerConfig,
    CNNConfig,
    CustomModelConfig,
    EnsembleConfig,
    FemnistCNNConfig,
    MLPConfig,
    ModelConfig,
    ResNetConfig,
    SupernetConfig,
    ViTConfig,
)
from rayfl.models.char import CharLSTM, CharTransformer
from rayfl.models.inputs import InputSpec, to_input

__all__ = ["InputSpec", "build_model", "to_input"]


def _char_lstm(cfg: Any, spec: InputSpec) -> nn.Module:
    _require(spec, "tokens", cfg)
    return CharLSTM(cfg, spec.num_classes)


def _char_transformer(cfg: Any, spec: InputSpec) -> nn.Module:
    _require(spec, "tokens", cfg)
    return CharTransformer(cfg, spec.num_classes, spec.sample_shape[0])


def _elastic(cfg: Any, spec: InputSpec) -> nn.Module:
    from rayfl.models.families import build_family  # imports torch and every family: only for elastic models

    return build_family(cfg, spec).global_model()


def _custom(cfg: Any, spec: InputSpec) -> nn.Module:
    from rayfl.models.custom import build_custom_model

    return build_custom_model(cfg, spec)


def _require(spec: InputSpec, kind: str, cfg: ModelConfig) -> None:
    if spec.input_kind != kind:
        raise ValueError(f"model.name={cfg.name!r} needs {kind} inputs, but the data gives {spec.input_kind}")


_BUILDERS: dict[type[Any], Callable[[Any, InputSpec], nn.Module]] = {
    CharLSTMConfig: _char_lstm,
    CharTransformerConfig: _char_transformer,
    CNNConfig: _elastic,
    ResNetConfig: _elastic,
    ViTConfig: _elastic,
    CharBertConfig: _elastic,
    FemnistCNNConfig: _elastic,
    MLPConfig: _elastic,
    SupernetConfig: _elastic,
    CellNetConfig: _elastic,
    EnsembleConfig: _elastic,
    CustomModelConfig: _custom,
}


def build_model(cfg: ModelConfig, spec: InputSpec) -> nn.Module:
    """Build the global model for a data set; weights are initialised by the caller's seeded generator."""
    return _BUILDERS[type(cfg)](cfg, spec)
