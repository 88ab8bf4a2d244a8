"""Typed messages between the engine, the algorithm hooks and the client hosts.

Everything that crosses a process boundary is here, frozen, and free of Ray types. Parameters travel as
``dict[str, torch.Tensor]`` keyed by the global model's ``state_dict`` names. A run with several global models keeps
them in one flat dict: model 0 under its own names, model ``k > 0`` under ``m{k}/<name>``
(``fl/common/multimodel.py``), so sharding, reduction and checkpoints handle every model at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import torch

__all__ = [
    "Aggregate",
    "Assignment",
    "ClientOutcome",
    "ClientUpdate",
    "ClientView",
    "LinkDraw",
    "ModelArchitecture",
    "Params",
    "ServerState",
    "TensorSlice",
    "TrainTask",
]

Params = dict[str, torch.Tensor]


@runtime_checkable  # snapshots check a decoded value against its field's type (engine/persist/snapshot_codec.py)
class ModelArchitecture(Protocol):
    """The architecture of a global model, as the messages carry it (``TrainTask.model_config``,
    ``ServerState.models``): one of the config layer's model sections, which core does not know; the engine and the
    methods read it back as that config (``rayfl.config.model.as_model_config``). Core only passes it on, so it asks
    for no more than the ``name`` every model section has."""

    @property
    def name(self) -> str:
        """The section's ``model.name`` tag."""
        ...


@dataclass(frozen=True, slots=True)
class TensorSlice:
    """The elements of a global tensor that a client's (smaller) tensor covers.

    One entry per dimension: ``None`` keeps the whole dimension, an ``int64`` array keeps those global indices in
    that order. The client tensor equals ``global[np.ix_(*index)]`` (with ``None`` read as "all").
    """

    index: tuple[np.ndarray | None, ...]

    def torch_index(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """Broadcastable index tensors addressing the covered elements of a tensor of ``shape``."""
        ndim = len(shape)
        parts: list[torch.Tensor] = []
        for d, (idx, size) in enumerate(zip(self.index, shape, strict=True)):
            t = torch.arange(size) if idx is None else torch.as_tensor(idx, dtype=torch.long)
            parts.append(t.view([-1 if k == d else 1 for k in range(ndim)]))
        return tuple(parts)


@dataclass(frozen=True, slots=True)
class ClientView:
    """What ``assign`` may know about a sampled client at check-in: its data size and its budgets for this round
    (bytes of training memory; bytes it can move within the round's communication limit; training FLOPs it can do
    within the round's compute limit, ``system.compute_limit_s``; inf when unconstrained)."""

    client_id: int
    num_examples: int
    memory_budget: float = float("inf")
    bandwidth_budget: float = float("inf")
    compute_budget: float = float("inf")


@dataclass(frozen=True, slots=True)
class Assignment:
    """What a client trains this round.

    ``slices`` maps a parameter name to the part of it the client gets; a missing name means the whole tensor, and a
    name in ``skip`` is not sent at all. The sub-model library (models/elastic) fills these from a ``SubModelSpec``.
    """

    model_id: int = 0
    slices: dict[str, TensorSlice] = field(default_factory=dict)
    skip: frozenset[str] = frozenset()
    units: tuple[int, ...] | None = None  # the sub-model's units per search dimension; None = the whole model
    enforce_budgets: bool = True  # False: the client trains even when the model exceeds a budget (recorded)


@dataclass(frozen=True, slots=True)
class LinkDraw:
    """What an unstable link does to one client's transfers in one round (``rayfl/system/links.py``): the error rate
    drawn for it, and how many transfer units (columns) each direction delivers before its first failure (``-1``:
    none fails). ``column_ratio`` is the links' granularity, ``padding`` whether the client fills columns it missed
    from its own previous parameters (local model padding, paper 004 Eq. 5), remembered at ``memory_dtype``."""

    error_rate: float
    down_run: int
    up_run: int
    column_ratio: float
    padding: bool
    memory_dtype: str = "float32"  # the precision of the client's remembered model (``LinkConfig.memory_dtype``)


@dataclass(frozen=True, slots=True)
class TrainTask:
    """One client's work for one round, built by the engine from an ``Assignment``."""

    client_id: int
    round_idx: int
    seed: int
    lr: float
    assignment: Assignment
    link: LinkDraw | None = None  # unstable links: what this round's transfers deliver (None: perfect links)
    client_state: object | None = None  # the algorithm's own state of this client from its last round (or None)
    model_config: ModelArchitecture | None = None  # the architecture of model ``assignment.model_id``; None = the run's
    # keep the update that reaches the server in the client's memory (``eval_all_devices``: the all-device model)
    keep_upload: bool = False


@dataclass(frozen=True, slots=True)
class ClientUpdate:
    """A client's trained (sub-)tensors with the global elements they map to, and how much it counts."""

    client_id: int
    weight: float
    values: Params
    slices: dict[str, TensorSlice]
    num_examples: int
    train_loss: float
    num_steps: int
    # a tensor named here counts with this weight instead of ``weight`` (FedorAS's OPA: examples through its op)
    tensor_weights: dict[str, float] = field(default_factory=dict)
    client_state: object | None = None  # the algorithm's state to keep for this client (Algorithm.keeps_client_state)
    metrics: dict[str, float] = field(default_factory=dict)  # a method's own per-client numbers (e.g. layer norms)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientOutcome:
    """What the driver hears back about a client: its numbers, or why it produced no update (failures are data).
    Built by keyword only: twelve fields, several of the same type, are easily swapped by position."""

    client_id: int
    num_examples: int
    train_loss: float
    num_steps: int
    bytes_down: int
    bytes_up: int
    failure: str | None = None
    train_wall_s: float = 0.0  # host time of local training (used only with system.compute_time: measured)
    p_down: float = float("nan")  # unstable links: width ratio of the model that arrived (NaN: perfect links)
    p_up: float = float("nan")  # and of the update that arrived at the server
    model_id: int = 0  # which global model the client trained
    metrics: dict[str, float] = field(default_factory=dict)  # the update's ``metrics``, for the server side


@dataclass(frozen=True, slots=True)
class Aggregate:
    """The reducer's result: the element-wise mean of the updates, with uncovered elements left as they were.

    ``covered`` says which elements some client covered, for each tensor that the round covered only in part (bool,
    the tensor's shape); a tensor it does not name was covered whole (``coverage`` 1) or not at all (0). The server
    optimizer (``fl/common/server_opt.py``) moves only covered elements and their state."""

    params: Params
    coverage: dict[str, float]  # fraction of each tensor's elements that some client covered
    num_clients: int
    outcomes: tuple[ClientOutcome, ...] = ()  # every client that ran, in client-id order (metrics, losses, model ids)
    covered: dict[str, torch.Tensor] = field(default_factory=dict)  # per-element coverage of partly covered tensors


@dataclass(frozen=True, slots=True)
class ServerState:
    """Explicit server state: global parameters plus the algorithm's own typed state (``None`` when it has none).

    ``models`` lists the architecture of every global model in id order when a run holds several (their parameters
    are in ``params`` under ``m{k}/`` names); empty means the run's one configured model.
    """

    params: Params
    round_idx: int = 0
    opt_state: Params = field(default_factory=dict)
    algo_state: object | None = None
    models: tuple[ModelArchitecture, ...] = ()
