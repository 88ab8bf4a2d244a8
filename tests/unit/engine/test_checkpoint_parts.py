"""Client memories written beside a checkpoint's snapshot in part files, batch by batch (issue 32, finding 3): they
load back into ``client_states``, go with their checkpoint when it is pruned, and a damaged part makes its checkpoint
skipped like a damaged state file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rayfl.core.messages import ServerState
from rayfl.engine.exec.client_state import ClientMemory, ClientStateStore
from rayfl.engine.persist.checkpoint import CheckpointStore, RunSnapshot


def _snapshot(rounds_done: int) -> RunSnapshot:
    state = ServerState(params={"w": torch.arange(4, dtype=torch.float32)}, round_idx=rounds_done)
    return RunSnapshot(rounds_done, state, float(rounds_done), {}, {}, (0.5, 1.0, 10), 0, 1.0)


def _memories(n: int, shift: float = 0.0) -> dict[int, object]:
    out: dict[int, object] = {c: ClientMemory({"w": np.full(3, c + shift, np.float32)}, algo_state=c) for c in range(n)}
    out[n] = None  # a client that trained and keeps nothing
    return out


def _write(store: CheckpointStore, rounds_done: int, states: dict[int, object], batch: int) -> None:
    memories = ClientStateStore()
    memories.load_client_states(states)
    pending = store.write_state(_snapshot(rounds_done), memories.batches(batch))
    store.commit(pending, {})


def _equal(a: dict[int, object], b: dict[int, object]) -> bool:
    if a.keys() != b.keys():
        return False
    for c, m in a.items():
        o = b[c]
        if m is None or o is None:
            if m is not o:
                return False
            continue
        assert isinstance(m, ClientMemory) and isinstance(o, ClientMemory)
        if m.algo_state != o.algo_state or not np.array_equal(m.params["w"], o.params["w"]):  # type: ignore[index]
            return False
    return True


def test_client_memories_round_trip_through_part_files_and_are_pruned_with_their_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=1)
    states = _memories(10)
    _write(store, 1, states, batch=4)  # 11 clients: parts of 4, 4 and 3
    parts = sorted(p.name for p in store.dir.glob("round-000001.clients-*.safetensors"))
    assert parts == [f"round-000001.clients-{k:04d}.safetensors" for k in range(3)]
    found = store.latest()
    assert found is not None
    assert found[1].client_parts == () and _equal(found[1].client_states, states)

    newer = _memories(10, shift=0.5)
    _write(store, 2, newer, batch=4)
    assert not list(store.dir.glob("round-000001*"))  # the pruned checkpoint's parts went with it
    found = store.latest()
    assert found is not None and found[0].rounds_done == 2 and _equal(found[1].client_states, newer)


def test_a_damaged_client_part_makes_its_checkpoint_skipped(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    first, second = _memories(5), _memories(5, shift=0.5)
    _write(store, 1, first, batch=2)
    _write(store, 2, second, batch=2)
    part = store.dir / "round-000002.clients-0001.safetensors"
    raw = bytearray(part.read_bytes())
    raw[-1] ^= 0x01
    part.write_bytes(bytes(raw))
    found = store.latest()
    assert found is not None and found[0].rounds_done == 1 and _equal(found[1].client_states, first)
