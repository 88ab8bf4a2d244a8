"""Which elastic family a model config builds: ``build_family(cfg, input_spec)`` is the one entry point and
``FAMILIES`` the full table, over the families of ``rayfl/models/elastic/`` and the cell networks and supernets built
on them. Nothing outside ``rayfl/models`` needs to know a layer name: methods work with ``SubModelSpec``s,
``Selection``s and the slices the family produces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayfl.config.model import (
    CellNetConfig,
    CharBertConfig,
    CNNConfig,
    EnsembleConfig,
    FemnistCNNConfig,
    MLPConfig,
    ResNetConfig,
    SupernetConfig,
    ViTConfig,
)
from rayfl.models.cellnet.module import CellNetFamily
from rayfl.models.elastic.bert import CharBertFamily
from rayfl.models.elastic.convnets import FemnistCNNFamily, HeteroCNNFamily
from rayfl.models.elastic.family import ElasticFamily
from rayfl.models.elastic.mlp import MLPFamily
from rayfl.models.elastic.resnet import ResNetFamily
from rayfl.models.elastic.vit import ViTFamily
from rayfl.models.ensemble import EnsembleFamily
from rayfl.models.inputs import InputSpec
from rayfl.models.supernet import SupernetFamily
from rayfl.models.supernet_width import SupernetWidthFamily

__all__ = ["FAMILIES", "build_family"]


def _image(spec: InputSpec, cfg: Any) -> tuple[int, int]:
    if spec.input_kind != "image" or len(spec.sample_shape) != 3:
        raise ValueError(f"model.name={cfg.name!r} needs image inputs, but the data gives {_given(spec)}")
    return spec.sample_shape[0], spec.sample_shape[1]


def _given(spec: InputSpec) -> str:
    """The data's inputs in an error, with the way out for feature vectors."""
    if spec.input_kind != "features":
        return spec.input_kind
    return (f"feature vectors of {spec.sample_shape[0]} values: set model.name=mlp (or data.input_shape to [C, H, W] "
            "to read them as images)")  # fmt: skip


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
    channels, size = _image(spec, cfg)
    if cfg.elastic == "width":  # a realised path as a width-elastic network (any width method runs on it)
        return SupernetWidthFamily(cfg, in_channels=channels, num_classes=spec.num_classes, image_size=size)
    return SupernetFamily(cfg, in_channels=channels, num_classes=spec.num_classes, image_size=size)


def _cellnet(cfg: Any, spec: InputSpec) -> ElasticFamily:
    channels, size = _image(spec, cfg)
    return CellNetFamily(cfg, in_channels=channels, num_classes=spec.num_classes, image_size=size)


def _ensemble(cfg: Any, spec: InputSpec) -> ElasticFamily:
    channels, size = _image(spec, cfg)
    return EnsembleFamily(cfg, in_channels=channels, num_classes=spec.num_classes, image_size=size)


def _mlp(cfg: Any, spec: InputSpec) -> ElasticFamily:
    if spec.input_kind not in ("features", "image"):
        raise ValueError(f"model.name={cfg.name!r} needs feature vectors (or images), but the data gives "
                         f"{spec.input_kind}")  # fmt: skip
    return MLPFamily(cfg, spec.sample_shape, spec.num_classes)


def _char_bert(cfg: Any, spec: InputSpec) -> ElasticFamily:
    if spec.input_kind != "tokens":
        raise ValueError(f"model.name={cfg.name!r} needs token inputs, but the data gives {_given(spec)}")
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
    MLPConfig: _mlp,
    SupernetConfig: _supernet,
    CellNetConfig: _cellnet,
    EnsembleConfig: _ensemble,
}


def build_family(cfg: Any, spec: InputSpec) -> ElasticFamily:
    """The elastic family for a model config; ``ValueError`` names the config when it has none."""
    if type(cfg) not in FAMILIES:
        raise ValueError(f"model.name={cfg.name!r} has no elastic family (sub-models need one of {_names()})")
    return FAMILIES[type(cfg)](cfg, spec)


def _names() -> str:
    return ", ".join(sorted(c.__dataclass_fields__["name"].default for c in FAMILIES))
