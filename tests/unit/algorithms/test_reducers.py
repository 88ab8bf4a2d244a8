"""The count-weighted element-wise mean on hand-sized clients, including elements nobody covered."""

from __future__ import annotations

import numpy as np
import torch

from rayfl.algorithms.payloads import ClientUpdate, TensorSlice
from rayfl.algorithms.reducers import MaskedWeightedMean, Partial, split_partial
from rayfl.engine.param_server import plan_shards


def _update(cid: int, weight: float, value: list[list[float]], rows=None, cols=None) -> ClientUpdate:
    slices = {}
    if rows is not None or cols is not None:
        slices["w"] = TensorSlice((None if rows is None else np.array(rows), None if cols is None else np.array(cols)))
    return ClientUpdate(cid, weight, {"w": torch.tensor(value)}, slices, 1, 0.0, 1)


def test_three_clients_by_hand() -> None:
    prev = {"w": torch.full((2, 3), 9.0)}
    shapes = {"w": prev["w"].shape}
    # A covers row 0, columns 0-1; B covers both rows, columns 0 and 2; C covers row 1, column 2.
    a = _update(0, 1.0, [[1.0, 2.0]], rows=[0], cols=[0, 1])
    b = _update(1, 2.0, [[4.0, 5.0], [6.0, 7.0]], cols=[0, 2])
    c = _update(2, 1.0, [[10.0]], rows=[1], cols=[2])
    reducer = MaskedWeightedMean()
    partial: Partial = {}
    for u in (a, b, c):
        reducer.accumulate(partial, u, shapes)
    new, coverage = reducer.finalize(partial, prev)
    expected = torch.tensor(
        [
            [(1 * 1 + 2 * 4) / 3, 2.0, 5.0],  # (0,0): A and B; (0,1): A only; (0,2): B only
            [
                6.0,
                9.0,
                (2 * 7 + 1 * 10) / 3,
            ],  # (1,0): B only; (1,1): nobody -> previous value; (1,2): B and C
        ]
    )
    torch.testing.assert_close(new["w"], expected, rtol=0, atol=1e-6)
    assert coverage["w"] == 5 / 6


def test_full_updates_are_the_weighted_mean() -> None:
    prev = {"w": torch.zeros(2, 2)}
    reducer = MaskedWeightedMean()
    partial: Partial = {}
    reducer.accumulate(partial, _update(0, 3.0, [[1.0, 1.0], [1.0, 1.0]]), {"w": prev["w"].shape})
    reducer.accumulate(partial, _update(1, 1.0, [[5.0, 5.0], [5.0, 5.0]]), {"w": prev["w"].shape})
    new, coverage = reducer.finalize(partial, prev)
    torch.testing.assert_close(new["w"], torch.full((2, 2), 2.0))
    assert coverage == {"w": 1.0}


def test_grouped_and_sharded_reduction_equals_flat() -> None:
    gen = torch.Generator().manual_seed(0)
    prev = {
        "a": torch.randn(4, 5, generator=gen),
        "b": torch.randn(7, generator=gen),
        "c": torch.randn(3, 3, generator=gen),
    }
    shapes = {k: v.shape for k, v in prev.items()}
    updates = []
    for cid in range(6):
        values = {k: torch.randn(v.shape, generator=gen) for k, v in prev.items()}
        slices = {"a": TensorSlice((np.array([cid % 4]), None))} if cid % 2 else {}
        values["a"] = values["a"][[cid % 4]] if cid % 2 else values["a"]
        updates.append(ClientUpdate(cid, float(cid + 1), values, slices, cid + 1, 0.0, 1))
    reducer = MaskedWeightedMean()
    flat: Partial = {}
    for u in updates:
        reducer.accumulate(flat, u, shapes)
    expected, _ = reducer.finalize(flat, prev)
    # three "hosts" pre-aggregate their clients, then two shards merge per tensor in host order
    hosts: list[Partial] = [{}, {}, {}]
    for u in updates:
        reducer.accumulate(hosts[u.client_id % 3], u, shapes)
    shard_of = plan_shards({k: tuple(v.shape) for k, v in prev.items()}, 2)
    assert set(shard_of.values()) == {0, 1}
    got = {}
    for s in range(2):
        merged = reducer.merge([split_partial(h, shard_of, 2)[s] for h in hosts])
        new, _ = reducer.finalize(merged, {k: v for k, v in prev.items() if shard_of[k] == s})
        got.update(new)
    for k in prev:
        assert torch.equal(got[k], expected[k]), k
