"""Memory of per-client state (``engine/exec/client_state.py``) for 1,000 clients, as local model padding keeps it.

Each client's memory is its trained model of the last round it trained: its x p_k sub-model's float32 tensors. The
script (1) trains one real client per capacity on a client host of experiments/fedrescue/cpu.yaml with faulty links
and padding and reports its memory's tensor bytes and pickled size (what Ray's object store holds for it); (2) fills
an in-process ``ClientStateStore`` with 1,000 such memories (capacities 0.25/0.5/0.75/1 in turn, as the setting's
clients) and reports the Python heap it takes (tracemalloc); (3) gives the exact tensor bytes for 1,000 clients of
the paper's full-size models from the families' parameter counts. Each figure for memories kept at float32 (the
default) and at float16 (``system.links.memory_dtype: float16``). With ``--json PATH`` the figures also go to a JSON
file (``benchmarks/results/client_state_memory.json``).

Run: ``python benchmarks/client_state_memory.py [--json benchmarks/results/client_state_memory.json]``
"""

from __future__ import annotations

import argparse
import json
import pickle
import tracemalloc
from pathlib import Path

import numpy as np

from rayfl.config.model import ResNetConfig
from rayfl.core.messages import LinkDraw, TrainTask
from rayfl.engine.build import build_setup
from rayfl.engine.exec.client_state import ClientMemory, ClientStateStore, memory_bytes
from rayfl.engine.exec.host import ClientHost
from rayfl.experiment.loader import load_config
from rayfl.models.elastic.spec import SubModelSpec, first_k
from rayfl.models.families import build_family
from rayfl.models.inputs import InputSpec

CAPACITIES = (0.25, 0.5, 0.75, 1.0)
NUM_CLIENTS = 1000
_MB = 1e6


def _units(space, p: float) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    return space.units(SubModelSpec.uniform(space, p).ratios)


def _store_heap(memories: dict[float, ClientMemory], task: TrainTask) -> int:
    """Python heap (tracemalloc) of an in-process store holding 1,000 copies of the memories, capacities in turn."""
    tracemalloc.start()
    store = ClientStateStore()
    for c in range(NUM_CLIENTS):
        m = memories[CAPACITIES[c % len(CAPACITIES)]]
        copy = ClientMemory({k: v.copy() for k, v in (m.params or {}).items()}, m.slices, None)
        store.update([TrainTask(client_id=c, round_idx=0, seed=0, lr=0.0, assignment=task.assignment)], [copy])
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return int(held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")
    args = parser.parse_args()
    cfg = load_config(Path(__file__).parents[1] / "experiments" / "fedrescue" / "cpu.yaml")
    setup = build_setup(cfg)
    host = ClientHost(0, setup.dataset, cfg.model, setup.algorithm, cfg.backend, init_seed=1)
    assert host.family is not None
    space = host.family.space
    params = {k: v.numpy() for k, v in setup.params.items()}
    command = "python benchmarks/client_state_memory.py" + (f" --json {args.json}" if args.json else "")
    out: dict[str, object] = {"command": command, "clients": NUM_CLIENTS}
    for dtype in ("float32", "float16"):
        memories: dict[float, ClientMemory] = {}
        task = TrainTask(
            client_id=0,
            round_idx=0,
            seed=cfg.seed,
            lr=0.05,
            assignment=host.family.assignment(first_k(host.family.full_units)),
        )
        per_client = {}
        for c, p in enumerate(CAPACITIES):
            assignment = host.family.assignment(first_k(_units(space, p)))
            task = TrainTask(
                client_id=c,
                round_idx=0,
                seed=cfg.seed,
                lr=0.05,
                assignment=assignment,
                link=LinkDraw(
                    error_rate=0.15, down_run=1, up_run=2, column_ratio=0.125, padding=True, memory_dtype=dtype
                ),
            )
            *_, after = host.run_round([task], params, {k: 0 for k in params}, 1, params, None)
            assert isinstance(after, ClientMemory)
            memories[p] = after
            per_client[f"x{p:g}"] = {"tensor_bytes": memory_bytes(after), "pickled_bytes": len(pickle.dumps(after))}
            print(
                f"cpu.yaml model x{p:<4} {dtype}: {memory_bytes(after) / _MB:7.3f} MB of tensors, "
                f"{len(pickle.dumps(after)) / _MB:7.3f} MB pickled (one client's memory)"
            )
        held = _store_heap(memories, task)
        tensors = sum(memory_bytes(memories[CAPACITIES[c % 4]]) for c in range(NUM_CLIENTS))
        print(
            f"{NUM_CLIENTS} clients (capacities in turn) {dtype}: {tensors / _MB:.1f} MB of tensors, "
            f"{held / _MB:.1f} MB of Python heap in the in-process store (tracemalloc)"
        )
        out[f"cpu_yaml_cnn_{dtype}"] = {"per_client": per_client, "tensor_bytes": tensors, "store_heap_bytes": held}
    spec = InputSpec.of("image", 10, np.zeros((1, 3, 32, 32), dtype=np.uint8), {"mean": [0.5] * 3, "std": [0.25] * 3})
    for label, model in (("ResNet-18 (HeteroFL widths)", ResNetConfig(depth=18)),):
        fam = build_family(model, spec)
        numels = [fam.space.num_params(_units(fam.space, p)) for p in CAPACITIES]
        for dtype, size in (("float32", 4), ("float16", 2)):
            per = [size * n for n in numels]
            total = sum(per[c % 4] for c in range(NUM_CLIENTS))
            full = NUM_CLIENTS * per[-1]
            sizes = ", ".join(f"x{p}: {b / _MB:.1f} MB" for p, b in zip(CAPACITIES, per, strict=True))
            print(
                f"{label} {dtype}: per client {sizes}; {NUM_CLIENTS} clients: {total / 1e9:.2f} GB "
                f"(capacities in turn), {full / 1e9:.2f} GB (all at x1)"
            )
            out[f"resnet18_{dtype}"] = {
                "per_client_bytes": per,
                "capacities_in_turn_bytes": total,
                "all_x1_bytes": full,
            }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
