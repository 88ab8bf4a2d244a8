"""Transformable networks for FedTrans (paper 002): architectures as graphs of cells, their widening and deepening,
and the module and elastic family that run them (``rayfl.models.cellnet.module``: ``CellNet``, ``CellNetFamily``,
not imported here, so algorithms can use the graphs without importing the elastic families). ``model.name:
cellnet`` (``CellNetConfig``)."""

from __future__ import annotations

from rayfl.models.cellnet.graph import CLASSES, IMAGE, Graph, Op, base_graph
from rayfl.models.cellnet.transform import (
    RESET,
    apply_step,
    build_graph,
    deepen_step,
    op_tensors,
    parse_step,
    tensor_name,
    transform_params,
    widen_step,
)

__all__ = [
    "CLASSES",
    "IMAGE",
    "RESET",
    "Graph",
    "Op",
    "apply_step",
    "base_graph",
    "build_graph",
    "deepen_step",
    "op_tensors",
    "parse_step",
    "tensor_name",
    "transform_params",
    "widen_step",
]
