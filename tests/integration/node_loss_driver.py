"""``rayfl`` run by ``test_node_loss.py`` in a process of its own (joining the test's cluster): the command line as
it is, with FedAvg replaced by a FedAvg that pauses where the test kills a node.

``NODE_LOSS_PAUSE=train:R``: every host's first client of round R waits (the host's process inside its training
call); ``NODE_LOSS_PAUSE=server:R``: the driver waits in round R's server update (every host idle). Each process that
pauses writes ``paused.<pid>`` into ``NODE_LOSS_DIR`` and goes on once the test has written ``go`` there (a host's
replacement, re-running the round, finds it and does not wait). Run as a script, so that Ray ships the class by value.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from rayfl import cli
from rayfl.engine import build as build_module
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.fedavg.algorithm import FedAvg

DIRECTORY = os.environ["NODE_LOSS_DIR"]
WHERE, _, AT = os.environ["NODE_LOSS_PAUSE"].partition(":")
ROUND = int(AT)
WAIT_S = 180.0


def pause() -> None:
    here = Path(DIRECTORY)
    (here / f"paused.{os.getpid()}").touch()
    deadline = time.monotonic() + WAIT_S
    while not (here / "go").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"pid {os.getpid()}: the test never let the run go on")
        time.sleep(0.05)


class PausingFedAvg(FedAvg):
    def local_train(self, ctx: Any, x: Any, y: Any) -> Any:
        if WHERE == "train" and ctx.task.round_idx == ROUND:
            pause()
        return super().local_train(ctx, x, y)

    def server_update(self, state: Any, round_idx: int, aggregate: Any) -> Any:
        if WHERE == "server" and round_idx == ROUND:
            pause()
        return super().server_update(state, round_idx, aggregate)


_build = build_module.build_run_algorithm


def build(cfg: ExperimentConfig) -> Any:
    algorithm = _build(cfg)
    return PausingFedAvg(cfg.algorithm, cfg.train) if type(algorithm) is FedAvg else algorithm


build_module.build_run_algorithm = build  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
