"""The count-weighted element-wise mean on hand-sized clients, including elements nobody covered."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from rayfl.core.messages import ClientUpdate, TensorSlice
from rayfl.core.partials import ArrayWeightedMean
from rayfl.core.reducers import MaskedWeightedMean, Partial, as_arrays, split_partial
from rayfl.engine.exec.param_server import plan_shards


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
    # which elements were covered (the server optimizer's mask): all but (1, 1)
    covered = reducer.covered(partial, prev)
    assert torch.equal(covered["w"], torch.tensor([[True, True, True], [True, False, True]]))


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


def test_numpy_shard_side_equals_the_torch_reducer_bit_for_bit() -> None:
    """The parameter-server shards reduce numpy partials without torch (``rayfl/core/partials.py``): the same numbers as
    ``MaskedWeightedMean.merge``/``finalize``, for whole and sliced updates, float and integer tensors."""
    gen = torch.Generator().manual_seed(1)
    prev = {
        "a": torch.randn(5, 6, generator=gen),
        "b": torch.randn(9, generator=gen),
        "count": torch.tensor(7, dtype=torch.int64),
        "idle": torch.randn(3, generator=gen),  # nobody covers it: keeps its value
    }
    shapes = {k: v.shape for k, v in prev.items()}
    reducer = MaskedWeightedMean()
    hosts: list[Partial] = [{}, {}, {}]
    for cid in range(7):
        values = {k: torch.randn(shapes[k], generator=gen) * 3 for k in ("a", "b")}
        values["count"] = torch.tensor(cid + 2, dtype=torch.int64)
        slices = {}
        if cid % 3 == 1:  # "a": only these clients, each on a few rows and columns
            rows = np.array(sorted({cid % 5, (cid + 2) % 5}))
            slices["a"] = TensorSlice((rows, np.array([0, 2, 3])))
            values["a"] = values["a"][rows][:, [0, 2, 3]]
        else:
            del values["a"]
        reducer.accumulate(hosts[cid % 3], ClientUpdate(cid, float(cid + 1) / 3, values, slices, 1, 0.0, 1), shapes)
    expected, expected_cov = reducer.finalize(reducer.merge(hosts), prev)
    shard = ArrayWeightedMean()
    got, cov = shard.finalize(shard.merge([as_arrays(h) for h in hosts]), {k: v.numpy() for k, v in prev.items()})
    assert cov == expected_cov and cov["a"] < 1.0 and cov["idle"] == 0.0
    for k, v in expected.items():
        assert got[k].dtype == v.numpy().dtype and np.array_equal(got[k], v.numpy()), k
        assert got[k].tobytes() == v.numpy().tobytes(), k
    # per-element coverage only for the tensor covered in part ("b" and "count" whole, "idle" not at all), the same
    masks = reducer.covered(reducer.merge(hosts), prev)
    array_masks = shard.covered(shard.merge([as_arrays(h) for h in hosts]), {k: v.numpy() for k, v in prev.items()})
    assert list(masks) == list(array_masks) == ["a"]
    assert np.array_equal(array_masks["a"], masks["a"].numpy()) and int(masks["a"].sum()) == cov["a"] * 30


def test_process_roles_import_only_what_they_need() -> None:
    """A parameter-server shard's process (its module and the numpy partials it receives) loads no torch, nor does
    the module that starts Ray (the CLI imports the driver while Ray starts); a client host loads torch but not
    triton, which torch's FLOP counter imports (20 MiB), and its training not torch._dynamo, which torch.optim
    imports on first use (82 MiB and seconds)."""
    code = (
        "import sys\n"
        "import rayfl.engine.exec.param_server, rayfl.core.partials, rayfl.engine.ray.session\n"
        "assert 'torch' not in sys.modules, 'a shard or the Ray start imports torch'\n"
        "import rayfl.engine.ray.pool\n"
        "assert 'triton' not in sys.modules, 'a client host imports triton'\n"
        "import torch\n"
        "from torch import nn\n"
        "from rayfl.fl.api.optim import client_optimizer\n"
        "m = nn.Linear(3, 2)\n"
        "for kind in ('sgd', 'adam'):\n"
        "    opt = client_optimizer(kind, list(m.parameters()), 0.1, momentum=0.9, weight_decay=1e-4)\n"
        "    opt.zero_grad(); m(torch.randn(4, 3)).sum().backward(); opt.step()\n"
        "assert 'torch._dynamo' not in sys.modules, 'client training imports torch._dynamo'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
