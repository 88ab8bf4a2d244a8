"""Multi-phase runs: several algorithms one after another on one simulated clock, one set of records, one report.

A run with ``phases`` (``PhaseConfig``: name, rounds, algorithm section) is a ``PhaseSchedule``: phase ``k`` owns the
global rounds ``[start_k, start_k + rounds_k)``, so the phase of a round is a function of ``round_idx`` alone and a
checkpoint needs nothing beyond the round index and the state. The driver asks the schedule three things per round:

* ``begin_round(round_idx, state, pool)``: the round's algorithm and state. At a phase's first round the state is
  handed over: the phase's algorithm receives the previous phase's final state (``enter_phase`` when it defines one,
  else ``init_state`` on the previous parameters). A *server phase* (an algorithm with ``server_round``, e.g. FedorAS's
  search) then does its round's work on the server, with a ``TaskPool`` for parallel work, and returns its modelled
  server seconds, which the clock adds (``system.server_time: measured`` replaces them by measured time).
* ``clients_per_round(round_idx, default)``: 0 in server phases (no client trains), else the phase's own figure or
  the run's.
* ``train(train, round_idx)`` and ``lr(train, round_idx)``: the round's local training (the run's ``train`` with the
  phase's own ``lr`` and ``epochs``; the clock prices those epochs) and its client learning rate, the schedule
  running over the phase's own rounds.

At the end, ``summary`` gives per phase its rounds, simulated seconds and last accuracy, plus ``phase_result(state)``
of algorithms that report one (FedorAS's search: the chosen path per tier), taken from the phase's final state.

Client hosts receive one ``PhasedAlgorithm`` and ask every client-side hook of the phase of the task's round
(``capabilities.for_round``). All phases aggregate with the one reduction (``Algorithm.reducer``, whose per-tensor
weights cover FedorAS's OPA); phases cannot bring their own evaluation model (HeteroFL's static-BN copy), since a host
builds that once. A run without ``phases`` is a one-phase schedule of its ``algorithm`` and runs exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from torch import nn

from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Params, ServerState
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.algorithm import Algorithm, ServerContext, round_lr
from rayfl.fl.api.capabilities import PhaseEntry, PhaseResult, ServerPhase, eval_model
from rayfl.fl.api.tasks import TaskPool
from rayfl.fl.registry import build_algorithm
from rayfl.models.elastic import ElasticFamily
from rayfl.models.inputs import InputSpec

# PhaseEntry, ServerPhase and PhaseResult live with the other capabilities (``rayfl/fl/api/capabilities.py``) and are
# re-exported here, where they are used
__all__ = [
    "Phase",
    "PhaseEntry",
    "PhaseResult",
    "PhaseSchedule",
    "PhasedAlgorithm",
    "ServerPhase",
    "build_run_algorithm",
]


@dataclass(frozen=True)
class Phase:
    """A phase's rounds ``[start, start + rounds)``, its algorithm (built with the phase's own local training,
    ``algorithm.train``) and its clients per round (0: the run's)."""

    name: str
    start: int
    rounds: int
    algorithm: Algorithm
    clients_per_round: int = 0


class PhasedAlgorithm(Algorithm):
    """The algorithms of a multi-phase run, as client hosts hold them. It is a ``capabilities.RoundDispatch``: a host
    asks every client-side hook of a task (``local_train`` and all it calls, ``client_weight``,
    ``keeps_client_state``) of ``at(task.round_idx)``, the phase's own algorithm, so no hook is forwarded by hand and
    none can be missed."""

    name = "phased"

    def __init__(self, phases: Sequence[Phase], train: TrainConfig) -> None:
        super().__init__(None, train)
        self.phases = tuple(phases)

    def index_of(self, round_idx: int) -> int:
        starts = [p.start for p in self.phases]
        return max(0, int(np.searchsorted(starts, round_idx, side="right")) - 1)

    def at(self, round_idx: int) -> Algorithm:
        """The algorithm of round ``round_idx``'s phase."""
        return self.phases[self.index_of(round_idx)].algorithm

    # ------------------------------------------------------------------------------------------ binding
    def bind_server(self, ctx: ServerContext) -> None:
        super().bind_server(ctx)
        for phase in self.phases:
            phase.algorithm.bind_server(ctx)

    def bind_client(self, family: ElasticFamily | None, input_spec: InputSpec) -> None:
        super().bind_client(family, input_spec)
        for phase in self.phases:
            phase.algorithm.bind_client(family, input_spec)

    def eval_model(self) -> nn.Module | None:
        if any(eval_model(phase.algorithm) is not None for phase in self.phases):
            raise ValueError("phases cannot bring their own evaluation model (a host builds one for the whole run)")
        return None

    def init_state(self, params: Params) -> ServerState:
        return self.phases[0].algorithm.init_state(params)


class PhaseSchedule:
    """Which algorithm runs round ``round_idx``, and the hand-over between phases (module docstring)."""

    def __init__(self, algorithm: Algorithm, rounds: int) -> None:
        if isinstance(algorithm, PhasedAlgorithm):
            self.phases = algorithm.phases
            self._phased: PhasedAlgorithm | None = algorithm
        else:
            self.phases = (Phase("", 0, rounds, algorithm),)
            self._phased = None
        self.total_rounds = sum(p.rounds for p in self.phases)
        self.results: dict[int, dict[str, object]] = {}  # phase index -> its ``phase_result`` at its end

    def index_of(self, round_idx: int) -> int:
        return 0 if self._phased is None else self._phased.index_of(round_idx)

    def phase_at(self, round_idx: int) -> Phase:
        return self.phases[self.index_of(round_idx)]

    def algorithm_at(self, round_idx: int) -> Algorithm:
        return self.phase_at(round_idx).algorithm

    def begin_round(self, round_idx: int, state: ServerState, pool: TaskPool) -> tuple[Algorithm, ServerState, float]:
        """The round's algorithm and state (handed over at a phase's first round), and modelled server seconds."""
        phase = self.phase_at(round_idx)
        algorithm = phase.algorithm
        if round_idx == phase.start and phase.start > 0:
            self._record_result(self.index_of(round_idx) - 1, state)
            if isinstance(algorithm, PhaseEntry):
                state = algorithm.enter_phase(state, round_idx)
            else:
                state = replace(algorithm.init_state(state.params), round_idx=round_idx)
        server_s = 0.0
        if isinstance(algorithm, ServerPhase):
            state, server_s = algorithm.server_round(state, round_idx, pool)
        return algorithm, state, server_s

    def clients_per_round(self, round_idx: int, default: int) -> int:
        phase = self.phase_at(round_idx)
        if isinstance(phase.algorithm, ServerPhase):
            return 0
        return phase.clients_per_round or default

    def train(self, train: TrainConfig, round_idx: int) -> TrainConfig:
        """The local training of round ``round_idx``: its phase's (``train`` itself in a run without phases)."""
        return train if self._phased is None else self.phase_at(round_idx).algorithm.train

    def lr(self, train: TrainConfig, round_idx: int) -> float:
        phase = self.phase_at(round_idx)
        return round_lr(self.train(train, round_idx), round_idx - phase.start, phase.rounds)

    def _record_result(self, index: int, state: ServerState) -> None:
        algorithm = self.phases[index].algorithm
        if isinstance(algorithm, PhaseResult):
            self.results[index] = algorithm.phase_result(state)

    def summary(self, records: Sequence[Any], final_state: ServerState) -> list[dict[str, object]]:
        """Per phase: name, rounds, simulated seconds spent in it, the last evaluated accuracy and, for algorithms
        that report one, the phase's result (the last phase's from ``final_state``)."""
        self._record_result(len(self.phases) - 1, final_state)
        out: list[dict[str, object]] = []
        for index, phase in enumerate(self.phases):
            rows = [r for r in records if phase.start <= r.round_idx < phase.start + phase.rounds]
            accs = [r.test_acc for r in rows if r.test_acc == r.test_acc]
            out.append(
                {
                    "name": phase.name,
                    "algorithm": phase.algorithm.name,
                    "rounds": phase.rounds,
                    "sim_time_s": float(sum(r.sim_duration_s for r in rows)),
                    "final_test_acc": accs[-1] if accs else float("nan"),
                    **({"result": self.results[index]} if index in self.results else {}),
                }
            )
        return out


def build_run_algorithm(cfg: ExperimentConfig) -> Algorithm:
    """The run's algorithm: ``cfg.algorithm``, or a ``PhasedAlgorithm`` of ``cfg.phases``."""
    if not cfg.phases:
        return build_algorithm(cfg.algorithm, cfg.train)
    phases: list[Phase] = []
    start = 0
    for p in cfg.phases:
        own = {k: v for k, v in (("lr", p.lr), ("epochs", p.epochs)) if v}
        algorithm = build_algorithm(p.algorithm, replace(cfg.train, **own))  # type: ignore[arg-type]
        phases.append(Phase(p.name, start, p.rounds, algorithm, p.clients_per_round))
        start += p.rounds
    return PhasedAlgorithm(phases, cfg.train)
