"""Memory of per-client state (``engine/client_state.py``) for 1,000 clients, as local model padding keeps it.

Each client's memory is its trained model of the last round it trained: its x p_k sub-model's float32 tensors. The
script (1) trains one real client per capacity on a client host of experiments/fedrescue/cpu.yaml with faulty links
and padding and reports its memory's tensor bytes and pickled size (what Ray's object store holds for it); (2) fills
an in-process ``ClientStateStore`` with 1,000 such memories (capacities 0.25/0.5/0.75/1 in turn, as the setting's
clients) and reports the Python heap it takes (tracemalloc); (3) gives the exact tensor bytes for 1,000 clients of
the paper's full-size models from the families' parameter counts.

Run: ``python benchmarks/client_state_memory.py``
"""

from __future__ import annotations

import pickle
import tracemalloc
from pathlib import Path

import numpy as np

from rayfl.algorithms.payloads import LinkDraw, TrainTask
from rayfl.algorithms.submodel import first_k
from rayfl.config import ResNetConfig
from rayfl.config_loader import load_config
from rayfl.engine.build import build_setup
from rayfl.engine.client_state import ClientMemory, ClientStateStore, memory_bytes
from rayfl.engine.host import ClientHost
from rayfl.models.elastic import build_family
from rayfl.models.elastic.spec import SubModelSpec
from rayfl.models.inputs import InputSpec

CAPACITIES = (0.25, 0.5, 0.75, 1.0)
NUM_CLIENTS = 1000
_MB = 1e6


def _units(space, p: float) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    return space.units(SubModelSpec.uniform(space, p).ratios)


def main() -> None:
    cfg = load_config(Path(__file__).parents[1] / "experiments" / "fedrescue" / "cpu.yaml")
    setup = build_setup(cfg)
    host = ClientHost(0, setup.dataset, cfg.model, setup.algorithm, cfg.backend, init_seed=1)
    assert host.family is not None
    space = host.family.space
    params = {k: v.numpy() for k, v in setup.params.items()}
    memories: dict[float, ClientMemory] = {}
    for c, p in enumerate(CAPACITIES):
        assignment = host.family.assignment(first_k(_units(space, p)))
        task = TrainTask(c, 0, cfg.seed, 0.05, assignment, link=LinkDraw(0.15, 1, 2, 0.125, True))
        *_, after = host.run_round([task], params, {k: 0 for k in params}, 1, params, None)
        assert isinstance(after, ClientMemory)
        memories[p] = after
        print(
            f"cpu.yaml model x{p:<4}: {memory_bytes(after) / _MB:7.3f} MB of tensors, "
            f"{len(pickle.dumps(after)) / _MB:7.3f} MB pickled (one client's memory)"
        )
    tracemalloc.start()
    store = ClientStateStore()
    for c in range(NUM_CLIENTS):
        m = memories[CAPACITIES[c % len(CAPACITIES)]]
        copy = ClientMemory({k: v.copy() for k, v in (m.params or {}).items()}, m.slices, None)
        store.update([TrainTask(c, 0, 0, 0.0, task.assignment)], [copy])
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tensors = sum(memory_bytes(memories[CAPACITIES[c % 4]]) for c in range(NUM_CLIENTS))
    print(
        f"{NUM_CLIENTS} clients (capacities in turn): {tensors / _MB:.1f} MB of tensors, "
        f"{held / _MB:.1f} MB of Python heap in the in-process store (tracemalloc)"
    )
    spec = InputSpec.of("image", 10, np.zeros((1, 3, 32, 32), dtype=np.uint8), {"mean": [0.5] * 3, "std": [0.25] * 3})
    for label, model in (("ResNet-18 (HeteroFL widths)", ResNetConfig(depth=18)),):
        fam = build_family(model, spec)
        per = [4 * fam.space.num_params(_units(fam.space, p)) for p in CAPACITIES]
        total = sum(per[c % 4] for c in range(NUM_CLIENTS))
        sizes = ", ".join(f"x{p}: {b / _MB:.1f} MB" for p, b in zip(CAPACITIES, per, strict=True))
        print(f"{label}: per client {sizes}; {NUM_CLIENTS} clients: {total / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
