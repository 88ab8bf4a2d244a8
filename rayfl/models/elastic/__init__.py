"""Elastic model families: sub-models with per-dimension widths and skippable blocks, and their cost model.

Which family a model config builds is ``rayfl/models/families.py`` (``build_family``), which also knows the cell
networks and supernets built on these families.
"""

from __future__ import annotations

from rayfl.models.elastic.bert import CharBertFamily
from rayfl.models.elastic.convnets import FemnistCNNFamily, HeteroCNNFamily
from rayfl.models.elastic.cost import CostModel, Costs, units_from_ratios
from rayfl.models.elastic.family import CostUnit, ElasticFamily, Scaler
from rayfl.models.elastic.mlp import MLPFamily
from rayfl.models.elastic.resnet import ResNetFamily
from rayfl.models.elastic.space import Axis, Dimension, SearchSpace, TensorLayout
from rayfl.models.elastic.spec import FirstK, RandomSubset, Rolling, Selection, SubModelSpec, TopKNorm, select
from rayfl.models.elastic.vit import ViTFamily

__all__ = [
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
    "MLPFamily",
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
    "select",
    "units_from_ratios",
]
























