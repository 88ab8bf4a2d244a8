"""The client context: everything an algorithm's client hooks know of the one client they train.

The engine makes one ``ClientContext`` per client and round (``ClientContext.of``) and hands it to ``local_train``,
which passes it on to ``train_batch``, ``backward_step`` and ``local_loss`` (``rayfl/fl/api/algorithm.py``). It holds
the client's task (its memory from its last round is ``memory``), the (sub-)model it trains, the input spec of its
data and the generator its batches are drawn from; and whatever a method computes in ``local_train`` for its batch
hooks to read, kept per type (``put``/``get``: one small frozen dataclass per method, e.g. FjORD's widths, FedProx's
anchor). An algorithm object is shared by every client a host trains, so none keeps a client's state on ``self``:
state in the context cannot leak into another client trained meanwhile, nor outlive its client's training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn

from rayfl.core.messages import TrainTask
from rayfl.core.rng import derive_torch_generator
from rayfl.models.inputs import InputSpec

__all__ = ["ClientContext"]

_T = TypeVar("_T")


@dataclass(eq=False, slots=True)
class ClientContext:
    """One client's training this round, as the client hooks see it (module docstring)."""

    task: TrainTask
    model: nn.Module  # the (sub-)model the client trains, loaded with what it received
    input_spec: InputSpec
    generator: torch.Generator  # the batch permutations' (CPU) generator: ``derive_torch_generator(.., "train", ..)``
    _state: dict[type, object] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def of(cls, task: TrainTask, model: nn.Module, input_spec: InputSpec) -> ClientContext:
        """The context of ``task``'s client training ``model``, its batches drawn by
        ``derive_torch_generator(seed, "train", round, client)``: the same wherever and whenever it runs."""
        generator = derive_torch_generator(task.seed, "train", task.round_idx, task.client_id)
        return cls(task=task, model=model, input_spec=input_spec, generator=generator)

    @property
    def memory(self) -> object | None:
        """The method's own state of this client from its last round (``Algorithm.keeps_client_state``), or None."""
        return self.task.client_state

    def put(self, value: object) -> None:
        """Keep ``value`` for this client's later hooks, under its type (replacing an earlier value of that type)."""
        self._state[type(value)] = value

    def get(self, kind: type[_T]) -> _T:
        """The value of type ``kind`` put earlier; a hook that needs it outside its method's ``local_train`` fails."""
        value = self._state.get(kind)
        if not isinstance(value, kind):
            raise RuntimeError(
                f"client {self.task.client_id}: no {kind.__name__} in the client context (a batch hook ran outside "
                "the local_train that puts it)"
            )
        return value
