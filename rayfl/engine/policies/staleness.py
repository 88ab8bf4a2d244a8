"""Staleness weights of asynchronous aggregation: how much an update counts that started ``tau`` server steps ago.

- ``none``: 1;
- ``polynomial``: (1 + tau)^-a (FedBuff, Nguyen et al. 2022, uses a = 0.5: 1 / sqrt(1 + tau); FedAsync, Xie et al.
  2019, calls it polynomial with exponent a);
- ``hinge``: 1 for tau <= b, else 1 / (a (tau - b) + 1) (FedAsync's hinge function).
"""

from __future__ import annotations

import numpy as np

from rayfl.config.sections import ServerConfig

__all__ = ["staleness_weight"]


def staleness_weight(server: ServerConfig, tau: np.ndarray | int) -> np.ndarray:
    """The weight of updates of staleness ``tau`` (server steps), as float64."""
    t = np.asarray(tau, dtype=np.float64)
    if server.staleness == "none":
        return np.ones_like(t)
    if server.staleness == "polynomial":
        return np.power(1.0 + t, -server.staleness_exponent)
    late = t > server.hinge_b
    return np.where(late, 1.0 / (server.hinge_a * (t - server.hinge_b) + 1.0), 1.0)
