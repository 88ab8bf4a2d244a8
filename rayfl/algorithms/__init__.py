"""Federated algorithms. ``ALGORITHMS`` is the single, explicit table of what a config's ``algorithm.name`` means."""

from __future__ import annotations

from typing import Any

from rayfl.algorithms.base import Algorithm, round_lr
from rayfl.algorithms.fedavg import FedAvg
from rayfl.config import TrainConfig

__all__ = ["ALGORITHMS", "Algorithm", "FedAvg", "build_algorithm", "round_lr"]

ALGORITHMS: dict[str, type[Algorithm]] = {
    "fedavg": FedAvg,
}


def build_algorithm(config: Any, train: TrainConfig) -> Algorithm:
    """The algorithm named by ``config.name``, configured."""
    return ALGORITHMS[config.name](config, train)
