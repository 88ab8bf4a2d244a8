"""FedorAS's tiers, subspace sampling (Eq. 2) and path sampling (Eq. 3-4) on hand-made cost tables."""

from __future__ import annotations

import numpy as np
import pytest

from rayfl.fl.methods.fedoras.sampling import (
    OpTables,
    path_flops,
    path_rng,
    random_paths,
    sample_path,
    sample_subspace,
    tier_brackets,
    tiers_by_shares,
)


def _toy_tables() -> OpTables:
    """3 layers x 3 ops (op 2 = identity): params and FLOPs by hand; fixed layers 100 params, 10 FLOPs."""
    params = np.array([[10.0, 40.0, 0.0], [20.0, 50.0, 0.0], [30.0, 60.0, 0.0]])
    flops = np.array([[1.0, 4.0, 0.0], [2.0, 5.0, 0.0], [3.0, 6.0, 0.0]])
    return OpTables(params=params, flops=flops, fixed_params=100.0, fixed_flops=10.0, identity=2)


def test_path_flops_is_fixed_plus_the_ops_of_the_path() -> None:
    tables = _toy_tables()
    assert path_flops(tables, np.array([[0, 1, 2], [1, 1, 1], [2, 2, 2]])).tolist() == [16.0, 25.0, 10.0]
    assert tables.max_flops == 25.0


def test_tier_brackets_on_a_toy_cost_table() -> None:
    """One layer, ops with FLOPs 0 (identity), 1, 2, 3: random path FLOPs are fixed (10) + one of them, each a
    quarter of the paths. With enough paths the sorted cumulative sum crosses 0.5 inside the FLOPs-12 block
    (10/46, 21/46, 33/46 ...), so the upper edge is 12; lower edge = fixed FLOPs; two tiers split [10, 12] evenly and
    the top tier ends at the largest path (13)."""
    tables = OpTables(
        params=np.zeros((1, 4)), flops=np.array([[1.0, 2.0, 3.0, 0.0]]), fixed_params=0.0, fixed_flops=10.0, identity=3
    )
    edges = tier_brackets(tables, 2, np.random.default_rng(0), num_paths=40_000, low=0.0, high=0.5)
    assert edges.tolist() == [10.0, 11.0, 13.0]


def test_tiers_by_shares_split_a_shuffle_by_the_shares() -> None:
    tiers = tiers_by_shares(8, (0.25, 0.25, 0.5), np.random.default_rng(3))
    assert np.bincount(tiers).tolist() == [2, 2, 4]
    again = tiers_by_shares(8, (0.25, 0.25, 0.5), np.random.default_rng(3))
    assert np.array_equal(tiers, again)


def test_subspace_sampling_never_exceeds_the_parameter_budget() -> None:
    """Full supernet: 100 + 210 = 310 parameters; the floor (identities only) is 100."""
    tables = _toy_tables()
    for limit in (100.0, 130.0, 175.0, 250.0, 310.0, 1000.0):
        for seed in range(50):
            mask = sample_subspace(tables, limit, np.random.default_rng(seed))
            assert tables.subspace_params(mask) <= limit
            assert mask[:, 2].all()  # the identity always stays
    # a limit of at least the whole supernet removes nothing
    assert sample_subspace(tables, 310.0, np.random.default_rng(0)).all()
    with pytest.raises(ValueError, match="no subspace fits"):
        sample_subspace(tables, 99.0, np.random.default_rng(0))


def test_subspace_without_identity_keeps_one_op_per_layer() -> None:
    tables = OpTables(
        params=np.array([[10.0, 40.0], [20.0, 50.0]]),
        flops=np.ones((2, 2)),
        fixed_params=0.0,
        fixed_flops=0.0,
        identity=None,
    )
    for seed in range(30):
        mask = sample_subspace(tables, 100.0, np.random.default_rng(seed))
        assert mask.sum(axis=1).min() >= 1
        assert tables.subspace_params(mask) <= 100.0


def test_sampled_paths_never_exceed_the_tier_flops() -> None:
    tables = _toy_tables()
    full = np.ones((3, 3), dtype=bool)
    for limit in (10.0, 12.0, 15.0, 18.0, 25.0):
        for batch in range(100):
            path = sample_path(tables, full, limit, path_rng(7, 3, 5, batch))
            assert path_flops(tables, path)[0] <= limit
    # with FLOPs 10 (the fixed cost) only identities fit
    assert sample_path(tables, full, 10.0, path_rng(0, 0, 0, 0)).tolist() == [2, 2, 2]


def test_paths_stay_inside_the_subspace_and_respect_flops_without_identity() -> None:
    tables = OpTables(
        params=np.ones((2, 3)),
        flops=np.array([[1.0, 5.0, 9.0], [2.0, 3.0, 8.0]]),
        fixed_params=0.0,
        fixed_flops=0.0,
        identity=None,
    )
    mask = np.array([[True, True, False], [False, True, True]])
    for batch in range(100):
        path = sample_path(tables, mask, 8.0, path_rng(1, 0, 0, batch))
        assert mask[np.arange(2), path].all()
        assert path_flops(tables, path)[0] <= 8.0  # op 0 of layer 0 (1) + op 1 of layer 1 (3), or 5 + 3
    with pytest.raises(ValueError, match="no path"):
        sample_path(tables, mask, 3.0, path_rng(1, 0, 0, 0))


def test_path_sampling_is_reproducible_from_seed_round_client_batch() -> None:
    tables = _toy_tables()
    full = np.ones((3, 3), dtype=bool)

    def draw(seed: int, round_idx: int, client: int, batch: int) -> list[int]:
        return sample_path(tables, full, 25.0, path_rng(seed, round_idx, client, batch)).tolist()

    keys = [(s, r, c, b) for s in (0, 1) for r in (0, 4) for c in (2, 9) for b in range(6)]
    first = [draw(*k) for k in keys]
    assert first == [draw(*k) for k in reversed(keys)][::-1]  # order of drawing does not matter
    assert len({tuple(p) for p in first}) > 5  # and different keys give different paths


def test_random_paths_cover_every_op() -> None:
    paths = random_paths(_toy_tables(), 300, np.random.default_rng(0))
    assert paths.shape == (300, 3)
    assert set(np.unique(paths).tolist()) == {0, 1, 2}


def test_tier_brackets_start_at_the_cheapest_path_without_identity() -> None:
    """No identity: the cheapest path costs fixed 10 + 1 + 2 = 13, the largest 10 + 4 + 5 = 19, so the brackets run
    from 13 (not from the fixed 10, which no path reaches) and the top tier ends at 19."""
    tables = OpTables(
        params=np.zeros((2, 2)),
        flops=np.array([[1.0, 4.0], [2.0, 5.0]]),
        fixed_params=0.0,
        fixed_flops=10.0,
        identity=None,
    )
    edges = tier_brackets(tables, 3, np.random.default_rng(0), num_paths=1000)
    assert edges[0] == 13.0 and edges[-1] == 19.0 and np.all(np.diff(edges) > 0)
