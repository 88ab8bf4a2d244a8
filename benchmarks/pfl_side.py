"""The scale benchmark's FedAvg workload run by Apple's pfl-research (``pfl``), for the side-by-side in issue 29.

Same workload as ``benchmarks/scale.py`` (``workload``): ``N`` clients with 64 random 3x32x32 images each (ten
labels), ``K`` clients per round, ``R`` rounds, one local epoch of batch-32 SGD (lr 0.05) on rayfl's CNN (channels
16, 32; built by ``rayfl.models.build_model``), FedAvg with a central SGD step of 1 (the plain average), in one
process (pfl's ``SimulatedBackend``), no evaluation. Prints one JSON row: ``end_to_end_s`` (from this script's start,
imports included, to the end of the last round), ``first_update_s`` (from the start to the first client's trained
update) and ``first_update_after_call_s`` (from ``algorithm.run``), ``steady_updates_per_s`` (rounds after the
first) and the process tree's ``peak_pss_mib`` (``process_roles.PssSampler``, as scale.py samples).

pfl must not go into rayfl's venv: make a separate one (here ``.pflvenv`` beside ``.venv`` in the repository root)
whose torch is rayfl's, then run with it::

    python3.11 -m venv .pflvenv && .pflvenv/bin/pip install pfl
    .venv/bin/python -c "import site; print(site.getsitepackages()[0])" \\
        > .pflvenv/lib/python3.11/site-packages/zz_rayfl_torch.pth
    PYTHONPATH=$PWD .pflvenv/bin/python benchmarks/pfl_side.py --n 100 --k 10 [--threads 1]

On a shared, loaded machine torch's default of a thread per core spins against the other processes (each conv and
backward several times slower); ``--threads 1`` trains as one of rayfl's in-process hosts does.
"""

from __future__ import annotations

import time

BEGAN = time.perf_counter()

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, one a core)")
    ns = parser.parse_args()
    from process_roles import PssSampler

    sampler = PssSampler()
    sampler.start()
    import numpy as np
    import torch
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel
    from torch import nn

    from rayfl.config.model import CNNConfig
    from rayfl.models import InputSpec, build_model

    if ns.threads:  # rayfl's in-process hosts train with one thread each (backend.num_hosts hosts, one a core)
        torch.set_num_threads(ns.threads)
    torch.manual_seed(ns.seed)

    def user_data(user: int) -> Dataset:
        """A user's 64 images and labels, made when pfl asks for them (as rayfl's synthetic data is lazy)."""
        rng = np.random.default_rng((ns.seed, user))
        x = torch.from_numpy(rng.random((64, 3, 32, 32), dtype=np.float32))
        return Dataset((x, torch.from_numpy(rng.integers(0, 10, size=64))))

    class Classifier(nn.Module):
        """rayfl's CNN with the ``loss`` and ``metrics`` pfl's PyTorchModel asks of a module."""

        def __init__(self) -> None:
            super().__init__()
            self.net = build_model(CNNConfig(channels=(16, 32)), InputSpec("image", 10, (3, 32, 32)))

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.net(inputs)
            return out

        def loss(self, inputs: torch.Tensor, targets: torch.Tensor, eval: bool = False) -> torch.Tensor:
            self.eval() if eval else self.train()
            return nn.functional.cross_entropy(self(inputs), targets)

        @torch.no_grad()
        def metrics(self, inputs: torch.Tensor, targets: torch.Tensor, eval: bool = True) -> dict[str, Any]:
            logits = self(inputs)
            loss = nn.functional.cross_entropy(logits, targets, reduction="sum").item()
            return {"loss": Weighted(loss, len(targets))}

    first: list[float] = []
    called: list[float] = []
    original = PyTorchModel.do_multiple_epochs_of

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if not first:
            first.append(time.perf_counter())
        return out

    PyTorchModel.do_multiple_epochs_of = timed  # type: ignore[method-assign]
    walls: list[float] = []

    from pfl.callback.base import TrainingProcessCallback

    class RoundWalls(TrainingProcessCallback):  # type: ignore[misc]
        def after_central_iteration(self, aggregate_metrics: Any, model: Any, *, central_iteration: int) -> Any:
            walls.append(time.perf_counter())
            return False, Metrics()

    users = list(range(ns.n))
    data = FederatedDataset(user_data, get_user_sampler("random", users))
    net = Classifier()
    model = PyTorchModel(
        model=net, local_optimizer_create=torch.optim.SGD, central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0)
    )
    backend = SimulatedBackend(training_data=data, val_data=data)
    params = NNAlgorithmParams(
        central_num_iterations=ns.rounds, evaluation_frequency=10_000, train_cohort_size=ns.k, val_cohort_size=None
    )
    train = NNTrainHyperParams(local_num_epochs=1, local_learning_rate=0.05, local_batch_size=32)
    called.append(time.perf_counter())
    FederatedAveraging().run(
        algorithm_params=params,
        backend=backend,
        model=model,
        model_train_params=train,
        model_eval_params=NNEvalHyperParams(local_batch_size=256),
        callbacks=[RoundWalls()],
    )
    end = time.perf_counter()
    sampler.stop()
    steady = [b - a for a, b in itertools.pairwise(walls)]
    print(
        json.dumps(
            {
                "framework": "pfl " + __import__("pfl").__version__,
                "n": ns.n,
                "k": ns.k,
                "rounds": ns.rounds,
                "end_to_end_s": end - BEGAN,
                "first_update_s": first[0] - BEGAN,
                "first_update_after_call_s": first[0] - called[0],
                "round_walls_s": [walls[0] - called[0], *steady],
                "steady_updates_per_s": ns.k * len(steady) / sum(steady) if steady else float("nan"),
                "peak_pss_mib": round(sampler.peak_total, 1),
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
