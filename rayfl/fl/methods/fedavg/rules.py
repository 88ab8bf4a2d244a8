"""What ``rayfl validate`` checks about FedAvg runs: its own server keys (``server_lr``, ``server_momentum``, kept as an
alias of ``server.optimizer: {name: sgd, lr, momentum}``) and ``server.optimizer`` are not both set, since one of them
would be silently ignored. Imports neither torch nor Ray."""

from __future__ import annotations

from typing import Any

from rayfl.config.sections import ServerOptimizerConfig
from rayfl.core.errors import KeyPath, Problem
from rayfl.fl.api.rules import RunView

__all__ = ["alias_conflict", "problems", "uses_alias"]


def uses_alias(algo: Any) -> bool:
    """Whether FedAvg's own keys ask for a server step other than plain averaging (lr 1, no momentum)."""
    return bool(algo.server_lr != 1.0 or algo.server_momentum != 0.0)


def alias_conflict(algo: Any, optimizer: ServerOptimizerConfig) -> bool:
    """FedAvg's own keys and ``server.optimizer`` both set away from their defaults."""
    return uses_alias(algo) and optimizer != ServerOptimizerConfig()


def problems(run: RunView, at: KeyPath, algo: Any) -> list[Problem]:
    """``server_lr`` / ``server_momentum`` and ``server.optimizer`` are not both set."""
    if not alias_conflict(algo, run.server.optimizer):
        return []
    reason = (
        "server_lr and server_momentum are FedAvg's old name for server.optimizer {name: sgd, lr, momentum}: set the "
        "server optimizer in one place (server.optimizer applies to every method), not both"
    )
    return [((*at, "server_lr" if algo.server_lr != 1.0 else "server_momentum"), reason)]
