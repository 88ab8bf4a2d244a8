"""Never a silently non-finite global model: a round whose aggregate or server step is not finite is refused.

The driver hands ``NonFiniteGuard.check`` the state the server update started from and the state it produced. When
every tensor of the new parameters and optimizer state is finite the new state stands; otherwise the round is rolled
back: the previous state stays the global model (the round's simulated time, client failures and client-side memories
stand, since the clients did that work) and the round's record says ``rolled_back = 1``. ``max_nonfinite_rounds``
such rounds in a row end the run with ``NonFiniteError``, whose message says what to change.

Client updates that are not finite never reach the aggregate: hosts drop them as ``nan_update`` failures.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rayfl.core.messages import ServerState

__all__ = ["NonFiniteError", "NonFiniteGuard", "all_finite", "first_nonfinite"]

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """The global model would have become non-finite in too many consecutive rounds."""


def first_nonfinite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first tensor holding a NaN or an infinity (``None`` when all are finite)."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def all_finite(tensors: Mapping[str, torch.Tensor]) -> bool:
    return first_nonfinite(tensors) is None


@dataclass
class NonFiniteGuard:
    """Rolls back non-finite server steps and counts them (see module docstring)."""

    limit: int
    streak: int = 0  # consecutive rolled-back rounds so far (a checkpoint carries it)

    def check(self, round_idx: int, before: ServerState, after: ServerState | None) -> ServerState:
        """``after`` when it is finite, else ``before`` (the round is rolled back and counted). ``after`` is
        ``None`` when the aggregate itself was not finite, so no server step was taken."""
        bad = "the aggregate" if after is None else first_nonfinite(after.params) or first_nonfinite(after.opt_state)
        if after is not None and bad is None:
            self.streak = 0
            return after
        self.streak += 1
        log.warning(
            "round %d: %s is not finite (%s); the round is rolled back to the previous global model (%d in a row, the "
            "run stops at %d)",
            round_idx,
            "the aggregate" if after is None else "the server step's result",
            bad,
            self.streak,
            self.limit,
        )
        return before

    def raise_if_exhausted(self, round_idx: int) -> None:
        if self.streak >= self.limit:
            first = round_idx - self.streak + 1
            raise NonFiniteError(
                f"the global model became non-finite in {self.streak} consecutive rounds ({first}-{round_idx}); each "
                "was rolled back and the run stopped: lower the learning rates (train.lr, server.optimizer.lr or "
                "algorithm.server_lr, algorithm.distill.lr) or set train.grad_clip_norm (max_nonfinite_rounds sets how "
                "many rounds to allow)"
            )
