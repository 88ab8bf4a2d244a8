"""Per-client state that persists across rounds, and local model padding (paper 004, Eq. 5).

Clients reach hosts afresh every round (``engine/exec/dispatch.py``: whichever host is free takes the next batch), so a
client's state cannot live on a host: it follows the client. The host returns each client's new ``ClientMemory`` beside
its outcome; the backend keeps a ``ClientStateStore`` (client id -> the memory, or on Ray an ``ObjectRef`` to it, so it
stays in the object store and never passes through the driver) and hands it back with the client's next task. Where a
client trains therefore never changes what it remembers, and the store holds at most one memory per client that ever
trained.

A memory holds three things, each only when something uses it:

* ``params``/``slices``: the client's own trained model of the last round it trained (its sub-model's tensors and
  the global positions they cover), kept when unstable links pad (``system.links.padding``);
* ``algo_state``: whatever the algorithm keeps per client (``Algorithm.keeps_client_state``; it receives it as
  ``TrainTask.client_state`` and returns the next one as ``ClientUpdate.client_state``);
* ``upload``: the last update of the client that reached the server (``KeptUpload``: values as the server received
  them, their global positions and weights), kept under ``eval_all_devices`` (``TrainTask.keep_upload``). The
  engine's all-device model is the algorithm's reducer over every client's kept upload (``reduce_uploads``): paper
  001 reports models averaged over all devices, not only the round's active ones. A round in which the client failed
  (its upload lost, its update not finite) keeps the upload it had.

Padding (Eq. 5): a client that received only the first ``p_d`` levels of its model fills the rest, up to its own
``p_k``, from its memory; positions its memory lacks (a client's first round, a capacity larger than before, or a
memory of another of the run's models) come from the run's initial global model, as Algorithm 2 initialises every
client's model with ``w x p_k``. "Initial" is what the run actually started from, not a fresh draw: the engine keeps
each global tensor's value from the first round that broadcast it to padding clients (``first_values``: the
algorithm's ``init_state``, e.g. HeteroFL's zeroed biases, and each of several global models' own weights; a model
added later, at its creation) and hands it to the hosts with the round's tasks; checkpoints keep it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rayfl.config.model import ModelConfig
from rayfl.core.messages import Assignment, ClientUpdate, Params, TensorSlice, TrainTask
from rayfl.core.rng import derive_seed
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.api.capabilities import for_round
from rayfl.models import InputSpec, build_model
from rayfl.models.elastic.family import gather

__all__ = [
    "ClientMemory",
    "ClientStateStore",
    "KeptUpload",
    "first_values",
    "initial_weights",
    "keeps_state",
    "memory_bytes",
    "own_global",
    "padded_tensor",
    "pads",
]


@dataclass(frozen=True, slots=True)
class KeptUpload:
    """A client's last update as the server received it (after link cuts and compression), named as in the flat
    parameter dict: what the all-device model averages for this client."""

    values: dict[str, np.ndarray]
    slices: dict[str, TensorSlice]
    weight: float
    tensor_weights: dict[str, float]

    @classmethod
    def of(cls, update: ClientUpdate) -> KeptUpload:
        """A copy of ``update``'s tensors (never a view of the round's global arrays or of a model's weights)."""
        values = {k: v.detach().cpu().numpy().copy() for k, v in update.values.items()}
        return cls(values, dict(update.slices), float(update.weight), dict(update.tensor_weights))

    def as_update(self, client_id: int, names: Mapping[str, object]) -> ClientUpdate:
        """The upload as a ``ClientUpdate`` for the reducer, restricted to the tensors in ``names`` (a tensor of a
        global model the run no longer holds is left out)."""
        values = {k: torch.from_numpy(v) for k, v in self.values.items() if k in names}
        slices = {k: v for k, v in self.slices.items() if k in values}
        return ClientUpdate(client_id, self.weight, values, slices, 0, float("nan"), 0, dict(self.tensor_weights))


@dataclass(frozen=True, slots=True)
class ClientMemory:
    """What one client remembers between the rounds it trains (see module docstring)."""

    params: dict[str, np.ndarray] | None = None
    slices: dict[str, TensorSlice] | None = None
    algo_state: object | None = None
    model_id: int = 0  # the global model ``params`` belong to (a run with several: a client may change model)
    upload: KeptUpload | None = None


def keeps_state(algorithm: Algorithm, tasks: Sequence[TrainTask]) -> bool:
    """Whether a round's clients carry memories: the algorithm keeps per-client state, links pad, or the run keeps
    every client's last upload (``eval_all_devices``)."""
    return any(
        for_round(algorithm, t.round_idx).keeps_client_state or t.keep_upload or (t.link is not None and t.link.padding)
        for t in tasks
    )


def pads(tasks: Sequence[TrainTask]) -> bool:
    """Whether a round's clients fill what their links lost from their own parameters (padding)."""
    return any(t.link is not None and t.link.padding for t in tasks)


def first_values(known: Params, params: Params, broadcast: bool = True) -> Params:
    """The run's initial value of every global tensor that padding clients may need: ``known`` less the tensors
    ``params`` no longer holds (a global model the run dropped: no client can pad it again, and checkpoints need not
    keep it), plus, when ``broadcast`` (this round's clients pad), a copy of every tensor of ``params`` it lacks, kept
    from the first round that broadcasts it. ``known`` itself, not a copy, when nothing changes (the Ray backend puts
    a new dict in the object store)."""
    new = [k for k in params if k not in known] if broadcast else []
    if not new and all(k in params for k in known):
        return known
    kept = {k: v for k, v in known.items() if k in params}
    return {**kept, **{k: params[k].detach().clone() for k in new}}


def memory_bytes(memory: ClientMemory | None) -> int:
    """Bytes of a memory's tensors, its kept upload included (its ``algo_state`` is the algorithm's and not
    counted)."""
    if memory is None:
        return 0
    params = sum(int(v.nbytes) for v in memory.params.values()) if memory.params is not None else 0
    return params + (sum(int(v.nbytes) for v in memory.upload.values.values()) if memory.upload is not None else 0)


class ClientStateStore:
    """Client id -> memory handle: the memory itself in-process, an object-store reference on Ray. ``fetch`` and
    ``put`` turn handles into memories and back (identity in-process)."""

    def __init__(
        self,
        fetch: Callable[[list[object]], list[object]] = list,
        put: Callable[[object], object] = lambda memory: memory,
    ) -> None:
        self._handles: dict[int, object] = {}
        self._fetch = fetch
        self._put = put

    def handles_for(self, tasks: Sequence[TrainTask]) -> list[object | None]:
        return [self._handles.get(t.client_id) for t in tasks]

    def update(self, tasks: Sequence[TrainTask], handles: Sequence[object]) -> None:
        if len(handles) != len(tasks):
            raise RuntimeError(f"a host returned {len(handles)} client memories for {len(tasks)} tasks")
        for task, handle in zip(tasks, handles, strict=True):
            self._handles[task.client_id] = handle

    def handles(self) -> list[tuple[int, object]]:
        """Every client's memory handle with its client id, in client-id order."""
        return [(c, self._handles[c]) for c in sorted(self._handles)]

    def client_states(self) -> dict[int, object]:
        """Every client's memory, by client id (for checkpoints)."""
        ids = sorted(self._handles)
        return dict(zip(ids, self._fetch([self._handles[c] for c in ids]), strict=True))

    def batches(self, size: int) -> Iterator[dict[int, object]]:
        """Every client's memory by client id, ``size`` clients at a time in client-id order (for checkpoints)."""
        ids = sorted(self._handles)
        for start in range(0, len(ids), size):
            chunk = ids[start : start + size]
            yield dict(zip(chunk, self._fetch([self._handles[c] for c in chunk]), strict=True))

    def load_client_states(self, states: Mapping[int, object]) -> None:
        """Replace the store's content by ``states`` (as ``client_states`` returned them)."""
        self._handles = {int(c): self._put(s) for c, s in states.items()}


def initial_weights(model_cfg: ModelConfig, spec: InputSpec, seed: int) -> dict[str, torch.Tensor]:
    """The global model's initial weights for ``seed``, drawn from a derived generator (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "init"))
        model = build_model(model_cfg, spec)
    return {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}


def own_global(
    initial: Mapping[str, torch.Tensor], memory: ClientMemory | None, model_id: int = 0
) -> dict[str, torch.Tensor]:
    """Global-shaped tensors of what the client itself holds of model ``model_id`` (``initial`` is that model's
    initial tensors): its remembered parameters where it has them, the initial global model elsewhere. A memory of
    another model is not used. Only the tensors the memory writes into are copies; the others are ``initial``'s own,
    which callers only read (padding reads them, ``padded_tensor``)."""
    own = dict(initial)
    if memory is None or memory.params is None or getattr(memory, "model_id", 0) != model_id:
        return own
    slices = memory.slices or {}
    for name, value in memory.params.items():
        start = own.get(name)
        if start is None:
            continue
        target = own[name] = start.clone()
        tslice = slices.get(name)
        tensor = torch.from_numpy(np.array(value)).to(target.dtype)
        if tslice is None:
            target.copy_(tensor)
        else:
            target[tslice.torch_index(tuple(target.shape))] = tensor
    return own


def padded_tensor(
    name: str,
    global_tensor: torch.Tensor,
    own_tensor: torch.Tensor,
    level: Assignment,
    arrived: Assignment | None,
) -> torch.Tensor:
    """The client's tensor ``name`` of the ``level`` sub-model: global values where the ``arrived`` levels covered
    them, the client's own values elsewhere (Eq. 5)."""
    tslice = level.slices.get(name)
    from_global = global_tensor if tslice is None else gather(global_tensor, tslice)
    from_own = own_tensor if tslice is None else gather(own_tensor, tslice)
    if arrived is None or name in arrived.skip:
        return from_own
    got = arrived.slices.get(name)
    shape = tuple(global_tensor.shape)
    mask = torch.ones((), dtype=torch.bool)
    for axis, size in enumerate(shape):
        given = None if tslice is None else tslice.index[axis]
        have: np.ndarray = np.arange(size) if given is None else given
        came = None if got is None else got.index[axis]
        keep: np.ndarray = np.ones(len(have), dtype=np.bool_) if came is None else np.isin(have, came)
        view = [1] * len(shape)
        view[axis] = len(have)
        mask = mask & torch.from_numpy(keep).view(view)
    return torch.where(mask, from_global, from_own)
