"""Round policies: when the server aggregates, orthogonal to the method (``server.policy``).

The driver (``engine/driver.py``) runs ``rounds`` calls of its policy's ``round``; a policy is the engine's own
concept, so any method runs under any policy and no method is named here:

- ``sync.py``: ``sync`` (wait for every client that can finish) and ``overcommit`` (sample more, keep the first K);
- ``buffered.py``: ``fedbuff`` and ``fedasync``, clients in flight on the simulated clock and a server step after
  every B arrivals, with the staleness weights of ``staleness.py``;
- ``planned.py``: search-only rounds (``engine/search_only.py``): a sync round's check-in, assignment and plan, with
  nothing trained.

Every policy ends its round the same way, with ``round_end.end_round`` (the evaluation when due, the records).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from rayfl.config.sections import ServerConfig
from rayfl.engine.parts import RunParts
from rayfl.engine.persist.records import ClientRecord, RoundRecord
from rayfl.engine.persist.resume import RunProgress
from rayfl.engine.policies.buffered import SERVER_RULES, BufferedRounds
from rayfl.engine.policies.planned import PlannedRounds
from rayfl.engine.policies.sync import SyncRounds
from rayfl.engine.round_record import RoundEvaluation
from rayfl.experiment.schema import ExperimentConfig

__all__ = ["PlannedRounds", "RoundPolicy", "build_policy", "is_asynchronous"]


class RoundPolicy(Protocol):
    def round(
        self, parts: RunParts, run: RunProgress, round_idx: int
    ) -> tuple[RoundRecord, list[ClientRecord], RoundEvaluation | None]:
        """One round (one server step): ``run`` moves on; returns the round's record, its clients' rows and its
        evaluation (``None`` when none was due)."""
        ...


def is_asynchronous(server: ServerConfig) -> bool:
    """Whether the policy steps on arrivals (FedBuff, FedAsync: a record's "round" is a server step) instead of
    rounds of sampled clients."""
    return server.policy in SERVER_RULES


# the synchronous policies by name (the asynchronous ones: ``SERVER_RULES``); over-commitment at 0 is sync
_SYNC_POLICIES: dict[str, Callable[[ServerConfig], SyncRounds]] = {
    "sync": lambda server: SyncRounds(),
    "overcommit": lambda server: SyncRounds(server.overcommit),
}


def build_policy(cfg: ExperimentConfig) -> RoundPolicy:
    """The run's round policy from ``server.policy`` (a search-only run takes ``PlannedRounds`` itself)."""
    rule = SERVER_RULES.get(cfg.server.policy)
    return BufferedRounds(cfg, rule(cfg)) if rule is not None else _SYNC_POLICIES[cfg.server.policy](cfg.server)
