"""Elastic model families: sub-models with per-dimension widths and skippable blocks, and their cost model.

``build_family(cfg, input_spec)`` is the one entry point; ``FAMILIES`` is the full list. Nothing outside
``rayfl/models`` needs to know a layer name: algorithms work with ``SubModelSpec``s, ``Selection``s and the slices
the family produces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayfl.config import (
    CellNetConfig,
    CharBertConfig,
    CNNConfig,
    FemnistCNNConfig,
    ResNetConfig,
    SupernetConfig,
    ViTConfig,
)
from rayfl.models.elastic.bert import CharBertFamily
from rayfl.models.elastic.convnets import FemnistCNNFamily, HeteroCNNFamily
from rayfl.models.elastic.cost import CostModel, Costs, units_from_ratios
from rayfl.models.elastic.family import CostUnit, ElasticFamily, Scaler
from rayfl.models.elastic.resnet import ResNetFamily
from rayfl.models.elastic.space import Axis, Dimension, SearchSpace, TensorLayout
from rayfl.models.elastic.spec import FirstK, RandomSubset, Rolling, Selection, SubModelSpec, TopKNorm, select
from rayfl.models.elastic.vit import ViTFamily
from rayfl.models.inputs import InputSpec

__all__ = [
    "FAMILIES",
    "Axis",
    "CharBertFamily",
    "CostModel",
    "CostUnit",
    "Costs",
    "Dimension",
    "ElasticFamily",
    "FemnistCNNFamily",
    "FirstK",
    "HeteroCNNFamily",
    "RandomSubset",
    "ResNetFamily",
    "Rolling",
    "Scaler",
    "SearchSpace",
    "Selection",
    "SubModelSpec",
    "TensorLayout",
    "TopKNorm",
    "ViTFamily",
    "build_family",
    "select",
    "units_from_ratios",
]


def _image(spec: InputSpec, cfg: Any) -> tuple[int, int]:
    if spec.input_kind != "image" or len(spec.sample_shape) != 3:
        raise ValueError(f"model.name={cfg.name!r} needs image inputs, but the data gives {spec.input_kind}")
    return spec.sample_shape[0], spec.sample_shape[1]


def _resnet(cfg: Any, spec: InputSpec) -> ElasticFamily:
    channels, size = _image(spec, cfg)
    return ResNetFamily(cfg, in_channels=channels, num_classes=spec.num_classes, image_size=size)


def _vit(cfg: Any, spec: InputSpec) -> ElasticFamily:
    channels, size = _image(spec, cfg)
    return ViTFamily(
        cfg, in_channels=channels, num_classes=spec.num_classes, image_size=size, **_transformer_sizes(cfg)
    )


def _hetero_cnn(cfg: Any, spec: InputSpec) -> ElasticFamily:
    channels, size = _image(spec, cfg)
    return HeteroCNNFamily(cfg, in_channels=channels, num_classes=spec.num_classes, image_size=size)


def _femnist_cnn(cfg: Any, spec: InputSpec) -> ElasticFamily:
    channels, size = _image(spec, cfg)
    return FemnistCNNFamily(cfg, in_channels=channels, num_classes=spec.num_classes, image_size=size)


def _supernet(cfg: Any, spec: InputSpec) -> ElasticFamily:
    from rayfl.models.supernet import SupernetFamily  # supernet.py imports this package's family module

    channels, size = _image(spec, cfg)
    return SupernetFamily(cfg, in_channels=channels, num_classes=spec.num_classes, image_size=size)


def _cellnet(cfg: Any, spec: InputSpec) -> ElasticFamily:
    from rayfl.models.cellnet.module import CellNetFamily  # the cellnet package imports this package's modules

    channels, size = _image(spec, cfg)
    return CellNetFamily(cfg, in_channels=channels, num_classes=spec.num_classes, image_size=size)


def _char_bert(cfg: Any, spec: InputSpec) -> ElasticFamily:
    if spec.input_kind != "tokens":
        raise ValueError(f"model.name={cfg.name!r} needs token inputs, but the data gives {spec.input_kind}")
    return CharBertFamily(cfg, vocab_size=spec.num_classes, seq_len=spec.sample_shape[0], **_transformer_sizes(cfg))


def _transformer_sizes(cfg: Any) -> dict[str, int | None]:
    """A transformer config's size overrides; 0 (the default) keeps the preset's value."""
    return {k: getattr(cfg, k) or None for k in ("embed_dim", "depth", "heads", "head_dim", "mlp_dim")}


FAMILIES: dict[type[Any], Callable[[Any, InputSpec], ElasticFamily]] = {
    ResNetConfig: _resnet,
    ViTConfig: _vit,
    CNNConfig: _hetero_cnn,
    FemnistCNNConfig: _femnist_cnn,
    CharBertConfig: _char_bert,
    SupernetConfig: _supernet,
    CellNetConfig: _cellnet,
}


def build_family(cfg: Any, spec: InputSpec) -> ElasticFamily:
    """The elastic family for a model config; ``ValueError`` names the config when it has none."""
    if type(cfg) not in FAMILIES:
        raise ValueError(f"model.name={cfg.name!r} has no elastic family (sub-models need one of {_names()})")
    return FAMILIES[type(cfg)](cfg, spec)


def _names() -> str:
    return ", ".join(sorted(c.__dataclass_fields__["name"].default for c in FAMILIES))
