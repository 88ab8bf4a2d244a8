"""Capabilities: hooks that a single method needs, kept out of the core contract (``algorithm.py``).

Every hook of ``Algorithm`` is one that every method has an answer to. A hook that only one paper needs is a
protocol here instead: the method that needs it defines the method, nothing else does, and the engine asks through
the function of the same name below, which checks ``isinstance`` against the protocol and otherwise does what every
other method does. A new capability is a protocol, its default, and one call site in the engine; the contract does
not grow, and a reader of ``Algorithm`` sees only what every method is about.

The protocols are ``runtime_checkable``: ``isinstance`` checks that the method exists (not its signature), so a
method implements a capability by defining the method with the protocol's signature, without inheriting from it.

This module imports nothing of the algorithm contract, so that ``algorithm.py`` can use the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from rayfl.core.messages import Assignment, ClientView, Params, ServerState

if TYPE_CHECKING:
    import numpy as np
    from torch import nn

    from rayfl.fl.api.tasks import TaskPool

__all__ = [
    "ClientModel",
    "CountsTrainFlops",
    "EvalModel",
    "EvalParams",
    "EvalStructures",
    "PhaseEntry",
    "PhaseResult",
    "RoundDispatch",
    "RunSummary",
    "ServerPhase",
    "StatefulAssign",
    "assign_with_state",
    "client_model",
    "eval_model",
    "eval_params",
    "eval_structures",
    "for_round",
    "run_summary",
    "train_flops",
]


class _Assigns(Protocol):
    """The core hooks the defaults below fall back to (``Algorithm`` has them)."""

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]: ...

    def client_model_id(self, state: ServerState, client_id: int) -> int: ...


# ---------------------------------------------------------------------------------------------- assignment
@runtime_checkable
class StatefulAssign(Protocol):
    """Model search (paper 000): its assignment grows a pool of structures that later rounds read, so assigning
    returns the state with the grown pool too. It lives in ``ServerState`` (and in checkpoints) even in a round whose
    server update is skipped because every client failed."""

    def assign_with_state(
        self, state: ServerState, round_idx: int, views: Sequence[ClientView]
    ) -> tuple[dict[int, Assignment], ServerState]: ...


def assign_with_state(
    algorithm: _Assigns, state: ServerState, round_idx: int, views: Sequence[ClientView]
) -> tuple[dict[int, Assignment], ServerState]:
    """The round's assignments and the state after assigning: ``assign``'s, the state unchanged, by default."""
    if isinstance(algorithm, StatefulAssign):
        return algorithm.assign_with_state(state, round_idx, views)
    return algorithm.assign(state, round_idx, views), state


@runtime_checkable
class CountsTrainFlops(Protocol):
    """FedorAS (paper 003): a client trains one path of a larger subspace per batch, so the cost model (which prices
    every op of the assigned subspace) would overstate its compute; it counts its paths' FLOPs itself."""

    def train_flops(
        self, round_idx: int, views: Sequence[ClientView], assignments: Mapping[int, Assignment]
    ) -> np.ndarray | None: ...


def train_flops(
    algorithm: object, round_idx: int, views: Sequence[ClientView], assignments: Mapping[int, Assignment]
) -> np.ndarray | None:
    """Each client's FLOPs of local training this round (aligned with ``views``) for the clock's modelled compute
    time; ``None`` (the default): the cost model's, the assigned model's training FLOPs per sample times samples."""
    if isinstance(algorithm, CountsTrainFlops):
        return algorithm.train_flops(round_idx, views, assignments)
    return None


# ---------------------------------------------------------------------------------------------- evaluation
@runtime_checkable
class EvalParams(Protocol):
    """HeteroFL's static batch norm (paper 002 Sec. 3): the evaluated model carries running statistics that are
    computed on the server from the training pool after each round, so the evaluated parameters are more than the
    global ones. Pairs with ``EvalModel`` (the module that holds those statistics)."""

    def eval_params(self, state: ServerState) -> Params: ...


def eval_params(algorithm: object, state: ServerState) -> Params:
    """The parameters the engine evaluates after a round: the global parameters by default."""
    if isinstance(algorithm, EvalParams):
        return algorithm.eval_params(state)
    return state.params


@runtime_checkable
class EvalModel(Protocol):
    """HeteroFL's static batch norm: client hosts evaluate with a copy of the global model whose batch norms track
    running statistics (the run's model does not), built once per host after ``bind_client``. Its ``state_dict`` must
    hold every name ``eval_params`` returns. ``None``: the run's global model."""

    def eval_model(self) -> nn.Module | None: ...


def eval_model(algorithm: object) -> nn.Module | None:
    """The module a client host evaluates ``eval_params`` with; ``None`` (the default) is the run's global model."""
    if isinstance(algorithm, EvalModel):
        return algorithm.eval_model()
    return None


@runtime_checkable
class EvalStructures(Protocol):
    """FedHeN (paper 004): the side-exit sub-model (its simple model) is evaluated every round besides the complex
    one. Names map to ``None`` (the full model) or unit counts (that first-k sub-model); each is recorded under its
    name in ``evals.csv``."""

    def eval_structures(self, state: ServerState) -> dict[str, tuple[int, ...] | None]: ...


def eval_structures(algorithm: object, state: ServerState) -> dict[str, tuple[int, ...] | None]:
    """Further structures the engine evaluates ``eval_params`` as, besides ``eval_units``'s: none by default."""
    if isinstance(algorithm, EvalStructures):
        return algorithm.eval_structures(state)
    return {}


@runtime_checkable
class ClientModel(Protocol):
    """FedTrans (paper 002): which of its models a client uses depends on the client's budgets (the compatible model
    of highest utility), so it needs the client's view, not only its id."""

    def client_model(self, state: ServerState, view: ClientView) -> int: ...


def client_model(algorithm: _Assigns, state: ServerState, view: ClientView) -> int:
    """The global model a client whose budgets are ``view`` uses now (the engine scores its test data on it):
    ``client_model_id`` by default, which ignores the budgets."""
    if isinstance(algorithm, ClientModel):
        return algorithm.client_model(state, view)
    return algorithm.client_model_id(state, view.client_id)


def client_models(algorithm: _Assigns, state: ServerState, views: Sequence[ClientView]) -> list[int]:
    """``client_model`` for every view, the protocol checked once (an ``isinstance`` against a runtime-checkable
    protocol costs ~35 us: most of a census of a million devices when asked per view)."""
    if isinstance(algorithm, ClientModel):
        return [algorithm.client_model(state, v) for v in views]
    return [algorithm.client_model_id(state, v.client_id) for v in views]


# ---------------------------------------------------------------------------------------------- run's end
@runtime_checkable
class RunSummary(Protocol):
    """FedTrans: the models it made and how, added to ``summary.json`` under the algorithm's name at a run's end
    (JSON-serialisable)."""

    def run_summary(self, state: ServerState) -> dict[str, object]: ...


def run_summary(algorithm: object, state: ServerState) -> dict[str, object]:
    """What the algorithm adds to ``summary.json``: nothing by default."""
    if isinstance(algorithm, RunSummary):
        return algorithm.run_summary(state)
    return {}


# ---------------------------------------------------------------------------------------------- phases
@runtime_checkable
class PhaseEntry(Protocol):
    """FedorAS's later phases (search, fine-tuning): they take over the previous phase's state in their own way (its
    tiers, its searched paths) rather than from its parameters alone (``init_state``)."""

    def enter_phase(self, previous: ServerState, round_idx: int) -> ServerState: ...


@runtime_checkable
class ServerPhase(Protocol):
    """FedorAS's search: its rounds run on the server only (no client trains); ``server_round`` returns the new state
    and the round's modelled server seconds, using ``pool`` for parallel work."""

    def server_round(self, state: ServerState, round_idx: int, pool: TaskPool) -> tuple[ServerState, float]: ...


@runtime_checkable
class PhaseResult(Protocol):
    """FedorAS's search and fine-tuning: what the phase produced (the chosen path per tier), for the run's summary,
    from the phase's final state."""

    def phase_result(self, state: ServerState) -> dict[str, object]: ...


@runtime_checkable
class RoundDispatch(Protocol):
    """A multi-phase run's algorithm on the client hosts (``engine/phases.py``): the algorithm that runs round
    ``round_idx``. Client hosts ask every client-side hook of a task (``local_train``, ``client_weight``,
    ``keeps_client_state``) of the task's round's algorithm, so a wrapper forwards all of them at once instead of
    one hook at a time."""

    def at(self, round_idx: int) -> object: ...


A = TypeVar("A")


def for_round(algorithm: A, round_idx: int) -> A:
    """The algorithm that runs round ``round_idx``: the phase's in a multi-phase run, else ``algorithm`` itself."""
    if isinstance(algorithm, RoundDispatch):
        return algorithm.at(round_idx)  # type: ignore[return-value]  # a phase's algorithm is an A as well
    return algorithm
