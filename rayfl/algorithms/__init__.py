"""Federated algorithms. ``ALGORITHMS`` is the single, explicit table of what a config's ``algorithm.name`` means."""

from __future__ import annotations

from typing import Any

from rayfl.algorithms.anycostfl import AnyCostFL
from rayfl.algorithms.base import Algorithm, round_lr
from rayfl.algorithms.fedavg import FedAvg
from rayfl.algorithms.feddropout import FedDropout
from rayfl.algorithms.fedhen import Decouple, FedHeN, NoSide
from rayfl.algorithms.fedoras import FedorAS
from rayfl.algorithms.fedoras_finetune import FedorASFinetune
from rayfl.algorithms.fedoras_search import FedorASSearch
from rayfl.algorithms.fedrescue import FedResCuE, FedRush, FedSeq
from rayfl.algorithms.fedrolex import FedRolex
from rayfl.algorithms.fedslim import FedSlim
from rayfl.algorithms.fedtrans import FedTrans
from rayfl.algorithms.fjord import FjORD
from rayfl.algorithms.heterofl import HeteroFL
from rayfl.algorithms.independent import IndependentFedAvg
from rayfl.algorithms.model_search import ModelSearchAlgorithm
from rayfl.config import TrainConfig

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AnyCostFL",
    "Decouple",
    "FedAvg",
    "FedDropout",
    "FedHeN",
    "FedResCuE",
    "FedRolex",
    "FedRush",
    "FedSeq",
    "FedSlim",
    "FedTrans",
    "FedorAS",
    "FedorASFinetune",
    "FedorASSearch",
    "FjORD",
    "HeteroFL",
    "IndependentFedAvg",
    "ModelSearchAlgorithm",
    "NoSide",
    "build_algorithm",
    "round_lr",
]

ALGORITHMS: dict[str, type[Algorithm]] = {
    "fedavg": FedAvg,
    "heterofl": HeteroFL,
    "fedrolex": FedRolex,
    "feddropout": FedDropout,
    "anycostfl": AnyCostFL,
    "fjord": FjORD,
    "model_search": ModelSearchAlgorithm,
    "fedoras": FedorAS,
    "fedoras_search": FedorASSearch,
    "fedoras_finetune": FedorASFinetune,
    "fedrescue": FedResCuE,
    "fedseq": FedSeq,
    "fedrush": FedRush,
    "fedslim": FedSlim,
    "fedhen": FedHeN,
    "noside": NoSide,
    "decouple": Decouple,
    "independent": IndependentFedAvg,
    "fedtrans": FedTrans,
}


def build_algorithm(config: Any, train: TrainConfig) -> Algorithm:
    """The algorithm named by ``config.name``, configured."""
    return ALGORITHMS[config.name](config, train)
