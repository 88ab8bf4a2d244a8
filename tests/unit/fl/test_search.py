"""Resource-constrained model search (paper 000, Algorithm 2) on a small ResNet18, against a sequential reference."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from rayfl.config.model import ResNetConfig, ViTConfig
from rayfl.core.messages import ClientView
from rayfl.core.rng import derive_rng
from rayfl.fl.common.search import ModelSearch, SearchResult, named_structure
from rayfl.fl.methods.model_search.config import ModelSearchConfig
from rayfl.models.elastic.cost import CostModel
from rayfl.models.elastic.resnet import ResNetFamily
from rayfl.models.elastic.vit import ViTFamily
from rayfl.system.resources import Levels

S = (0.0, 0.25, 0.5, 1.0)


@pytest.fixture(scope="module")
def fam() -> ResNetFamily:
    return ResNetFamily(ResNetConfig(depth=18, widths=(8, 16, 32, 64)))


@pytest.fixture(scope="module")
def cost(fam: ResNetFamily) -> CostModel:
    return CostModel(fam, batch_size=8)


def make(fam: ResNetFamily, cost: CostModel, **kw) -> ModelSearch:
    kw.setdefault("seed", 7)
    return ModelSearch(fam.space, cost, kw.pop("ratios", S), **kw)


def needs(cost: CostModel, units: Sequence[int]) -> tuple[float, float, float]:
    """(params, peak memory, bytes down + up) recomputed from scratch."""
    c = cost.model_cost(units)
    return c["params"], c["peak_memory"], c["bytes_down"] + c["bytes_up"]


def fits_view(cost: CostModel, units: Sequence[int], view: ClientView) -> bool:
    _, memory, comm = needs(cost, units)
    return memory <= view.memory_budget and comm <= view.bandwidth_budget


def crit_of(cost: CostModel, units: Sequence[int], criterion: str) -> float:
    params, memory, comm = needs(cost, units)
    return {"params": params, "memory": memory, "bytes": comm}[criterion]


def random_views(
    ms: ModelSearch, cost: CostModel, rng: np.random.Generator, n: int, lo: float = 0.8
) -> list[ClientView]:
    """Budgets from ``lo`` x the smallest structure's needs up to 1.1 x the largest's (some fit nothing)."""
    _, m0, c0 = needs(cost, ms.smallest)
    _, m1, c1 = needs(cost, ms.largest)
    ids = rng.choice(1000, size=n, replace=False)
    return [
        ClientView(int(cid), 10, float(rng.uniform(lo * m0, 1.1 * m1)), float(rng.uniform(lo * c0, 1.1 * c1)))
        for cid in ids
    ]


def client_draws(ms: ModelSearch, round_idx: int, client_id: int) -> list[tuple[int, ...]]:
    """The structures the sequential loop samples for a client: u, then D uniforms, then u, ... (module docstring)."""
    rng = derive_rng(ms.seed, "search", round_idx, client_id)
    out: list[tuple[int, ...]] = []
    u = rng.random()
    while u > ms.epsilon and len(out) < ms.t_max:
        x = rng.random(ms.num_dims)
        ratios = [a[min(int(xd * len(a)), len(a) - 1)] for xd, a in zip(x, ms.allowed_ratios, strict=True)]
        out.append(ms.space.units(ratios))
        u = rng.random()
    return out


class Reference:
    """Algorithm 2 written plainly: a pool list in insertion order, one client and one draw at a time."""

    def __init__(self, ms: ModelSearch, cost: CostModel) -> None:
        self.ms, self.cost = ms, cost
        self.pool: list[tuple[int, ...]] = [ms.smallest, ms.largest]
        self.cache: dict[tuple[int, ...], tuple[float, float, float]] = {}

    def costs(self, units: tuple[int, ...]) -> tuple[float, float, float]:
        if units not in self.cache:
            self.cache[units] = needs(self.cost, units)
        return self.cache[units]

    def crit(self, units: tuple[int, ...]) -> float:
        params, memory, comm = self.costs(units)
        return {"params": params, "memory": memory, "bytes": comm}[self.ms.criterion]

    def fits(self, units: tuple[int, ...], view: ClientView) -> bool:
        _, memory, comm = self.costs(units)
        return memory <= view.memory_budget and comm <= view.bandwidth_budget

    def round(self, views: Sequence[ClientView], round_idx: int) -> list[tuple[tuple[int, ...], bool, int]]:
        out = []
        for view in sorted(views, key=lambda v: v.client_id):
            best: tuple[int, ...] | None = None
            for units in self.pool:  # insertion order: the earliest wins ties
                if self.fits(units, view) and (best is None or self.crit(units) > self.crit(best)):
                    best = units
            sampled = client_draws(self.ms, round_idx, view.client_id)
            for units in sampled:
                if units not in self.pool and (self.ms.admit == "all" or self.fits(units, view)):
                    self.pool.append(units)
                if self.fits(units, view) and (best is None or self.crit(units) > self.crit(best)):
                    best = units
            out.append((best or self.ms.smallest, best is not None, len(sampled)))
        return out

    def pool_in_lookup_order(self) -> list[tuple[int, ...]]:
        order = sorted(range(len(self.pool)), key=lambda i: (-self.crit(self.pool[i]), i))
        return [self.pool[i] for i in order]


def check_fit(cost: CostModel, ms: ModelSearch, views: Sequence[ClientView], res: SearchResult) -> None:
    by_id = {v.client_id: v for v in views}
    for ch in res.choices:
        v = by_id[ch.client_id]
        params, memory, comm = needs(cost, ch.units)
        assert (ch.params, ch.peak_memory, ch.comm_bytes) == pytest.approx((params, memory, comm))
        fits = memory <= v.memory_budget and comm <= v.bandwidth_budget
        assert ch.fits == fits
        if not fits:
            assert ch.units == ms.smallest


def test_smallest_and_largest(fam: ResNetFamily, cost: CostModel) -> None:
    ms = make(fam, cost)
    space = fam.space
    assert ms.largest == tuple(int(s) for s in space.sizes)
    expected = space.units([0.0 if skip else 0.25 for skip in space.skippable])  # 0 only where skippable
    assert ms.smallest == expected
    assert ms.pool_size == 2 and ms.pool() == [ms.largest, ms.smallest]
    assert all(0.0 not in a for a, skip in zip(ms.allowed_ratios, space.skippable, strict=True) if not skip)
    with pytest.raises(ValueError):
        make(fam, cost, ratios=(0.0,))
    with pytest.raises(ValueError):
        make(fam, cost, epsilon=1.5)


def test_never_assigns_a_structure_that_does_not_fit(fam: ResNetFamily, cost: CostModel) -> None:
    ms = make(fam, cost, epsilon=0.5)
    rng = np.random.default_rng(0)
    unfit = 0
    for r in range(25):
        views = random_views(ms, cost, rng, 16)
        res = ms.assign_round(views, r)
        check_fit(cost, ms, views, res)
        unfit += sum(not c.fits for c in res.choices)
    assert unfit > 0  # the budgets do go below the smallest structure sometimes


def test_epsilon_one_keeps_the_initial_pool(fam: ResNetFamily, cost: CostModel) -> None:
    ms = make(fam, cost, epsilon=1.0)
    rng = np.random.default_rng(1)
    for r in range(5):
        views = random_views(ms, cost, rng, 12, lo=1.0)
        res = ms.assign_round(views, r)
        assert {c.units for c in res.choices} <= {ms.smallest, ms.largest}
        assert all(c.draws == 0 and not c.hit for c in res.choices) and res.hit_rate == 0.0
        assert res.pool_size == 2 and res.new_structures == 0
    res = ms.assign_round([ClientView(3, 1)], 9)  # unconstrained: the whole model
    assert res.choices[0].units == ms.largest


@pytest.mark.parametrize("epsilon", [0.0, 0.5, 0.8])
def test_draws_never_exceed_t_max(fam: ResNetFamily, cost: CostModel, epsilon: float) -> None:
    ms = make(fam, cost, epsilon=epsilon, t_max=3)
    rng = np.random.default_rng(2)
    for r in range(4):
        res = ms.assign_round(random_views(ms, cost, rng, 20), r)
        assert all(0 <= c.draws <= 3 and c.hit == (c.draws == 3) for c in res.choices)
        assert res.hit_rate == pytest.approx(np.mean([c.hit for c in res.choices]))
        if epsilon == 0.0:
            assert all(c.draws == 3 for c in res.choices) and res.hit_rate == 1.0
        assert [c.draws for c in res.choices] == [len(client_draws(ms, r, c.client_id)) for c in res.choices]


@pytest.mark.parametrize("criterion", ["params", "memory", "bytes"])
def test_adopts_only_fitting_larger_structures(fam: ResNetFamily, cost: CostModel, criterion: str) -> None:
    """On a fresh pool, a client's choice is the pool pick unless a sampled structure fits and is strictly larger."""
    rng = np.random.default_rng(3)
    adopted = 0
    for trial in range(12):
        ms = make(fam, cost, epsilon=0.0, t_max=5, criterion=criterion, seed=trial)
        (view,) = random_views(ms, cost, rng, 1, lo=1.0)
        (ch,) = ms.assign_round([view], 0).choices
        fitting = [u for u in client_draws(ms, 0, view.client_id) if fits_view(cost, u, view)]
        assert fits_view(cost, ms.smallest, view)  # the budgets are at least the smallest's needs
        pool_pick = ms.largest if fits_view(cost, ms.largest, view) else ms.smallest
        c0 = crit_of(cost, pool_pick, criterion)
        larger = [u for u in fitting if crit_of(cost, u, criterion) > c0]
        if not larger:
            assert ch.units == pool_pick
            continue
        adopted += 1
        top = max(crit_of(cost, u, criterion) for u in larger)
        assert ch.units == next(u for u in larger if crit_of(cost, u, criterion) == top)  # the first of the largest
        assert ch.fits and crit_of(cost, ch.units, criterion) > c0
    assert adopted > 0


def test_falls_back_to_the_smallest(fam: ResNetFamily, cost: CostModel) -> None:
    ms = make(fam, cost, epsilon=0.0)
    _, m0, c0 = needs(cost, ms.smallest)
    views = [
        ClientView(1, 10, 0.5 * m0, 1e30),  # memory too small for anything
        ClientView(2, 10, 1e30, 0.5 * c0),  # bandwidth too small for anything
        ClientView(3, 10, m0, c0),  # exactly the smallest
    ]
    res = ms.assign_round(views, 0)
    assert [c.units for c in res.choices] == [ms.smallest] * 3
    assert [c.fits for c in res.choices] == [False, False, True]
    assert all(c.draws == ms.t_max for c in res.choices)


@pytest.mark.parametrize("ratios", [S, (0.0, 1.0)])
@pytest.mark.parametrize("admit", ["all", "fitting"])
@pytest.mark.parametrize("criterion", ["params", "memory", "bytes"])
def test_deterministic_and_equal_to_the_sequential_reference(
    fam: ResNetFamily, cost: CostModel, criterion: str, admit: str, ratios: tuple[float, ...]
) -> None:
    """S = {0, 1} leaves 2^5 structures (blocks on or off), many with equal costs: there the tie rules matter."""
    rng = np.random.default_rng(4)
    a = make(fam, cost, epsilon=0.5, criterion=criterion, admit=admit, ratios=ratios)
    b = make(fam, cost, epsilon=0.5, criterion=criterion, admit=admit, ratios=ratios)
    ref = Reference(a, cost)
    assigned: set[tuple[int, ...]] = set()
    for r in range(4):
        views = random_views(a, cost, rng, 24)
        res_a = a.assign_round(views, r)
        res_b = b.assign_round(list(reversed(views)), r)  # same seed, views in another order: same result
        assert res_a.choices == res_b.choices
        assert [(c.units, c.fits, c.draws) for c in res_a.choices] == ref.round(views, r), r
        assert a.pool() == ref.pool_in_lookup_order()
        assigned |= {c.units for c in res_a.choices}
        assert res_a.distinct_assigned == len(assigned) and res_a.pool_size == len(ref.pool)


def test_ties_among_a_clients_own_draws(fam: ResNetFamily, cost: CostModel) -> None:
    """A lone client draws 40 times from the 32 on/off structures. Its budgets are exactly the needs of a structure
    with one of the two identical stage-0 blocks on: that structure and its mirror image tie for the largest fitting
    one, and the first drawn must win."""
    space = fam.space
    first, second = (space.dim_index(name) for name in ("0.0.mid", "0.1.mid"))
    ties = 0
    for seed in range(12):
        ms = make(fam, cost, epsilon=0.0, t_max=40, ratios=(0.0, 1.0), seed=seed)
        on = np.random.default_rng(seed).random(len(space.dims)) < 0.5
        units = [
            int(n) if keep or not skip else 0 for n, keep, skip in zip(space.sizes, on, space.skippable, strict=True)
        ]
        units[first], units[second] = int(space.sizes[first]), 0
        _, memory, comm = needs(cost, units)
        mirror = list(units)
        mirror[first], mirror[second] = 0, int(space.sizes[second])
        assert needs(cost, mirror) == needs(cost, units)
        views = [ClientView(seed, 10, memory, comm)]
        drawn = set(client_draws(ms, 0, seed))
        ties += tuple(units) in drawn and tuple(mirror) in drawn
        expected = Reference(ms, cost).round(views, 0)
        assert [(c.units, c.fits, c.draws) for c in ms.assign_round(views, 0).choices] == expected
    assert ties > 0


def test_another_seed_draws_differently(fam: ResNetFamily, cost: CostModel) -> None:
    views = random_views(make(fam, cost), cost, np.random.default_rng(6), 24)
    draws = [
        [c.draws for c in make(fam, cost, epsilon=0.5, seed=seed).assign_round(views, 0).choices] for seed in (7, 8)
    ]
    assert draws[0] != draws[1]


def test_admit_fitting_keeps_only_fitting_samples(fam: ResNetFamily, cost: CostModel) -> None:
    ms = make(fam, cost, epsilon=0.0, admit="fitting")
    _, m0, c0 = needs(cost, ms.smallest)
    ms.assign_round([ClientView(i, 10, 0.5 * m0, c0) for i in range(5)], 0)
    assert ms.pool_size == 2
    ms.assign_round([ClientView(i, 10, 1e30, 1e30) for i in range(5)], 1)
    assert ms.pool_size > 2


@pytest.mark.parametrize(("criterion", "index"), [("memory", 1), ("bytes", 2)])
def test_criterion_picks_by_that_cost(fam: ResNetFamily, cost: CostModel, criterion: str, index: int) -> None:
    """With every sample admitted the pools do not depend on the criterion, so each choice maximises its own cost.

    Traffic is proportional to parameters under a constant upload factor, so for ``bytes`` the uploads of models
    above half the largest model's size are compressed 20x (a size-dependent codec), so traffic orders structures
    differently.
    """
    if criterion == "bytes":
        ms = make(fam, cost)
        mid = (needs(cost, ms.smallest)[0] + needs(cost, ms.largest)[0]) / 2
        cost = CostModel(fam, batch_size=8, upload_compression=lambda p: np.where(p > mid, 0.05, 1.0))
    by_params = make(fam, cost, epsilon=0.3)
    by_other = make(fam, cost, epsilon=0.3, criterion=criterion)
    rng = np.random.default_rng(5)
    strict = 0
    for r in range(5):
        views = random_views(by_params, cost, rng, 20, lo=1.0)
        a = by_params.assign_round(views, r).choices
        b = by_other.assign_round(views, r).choices
        assert by_params.pool_size == by_other.pool_size
        for ca, cb in zip(a, b, strict=True):
            assert needs(cost, cb.units)[index] >= needs(cost, ca.units)[index] - 1e-6
            assert needs(cost, ca.units)[0] >= needs(cost, cb.units)[0] - 1e-6
            strict += needs(cost, cb.units)[index] > needs(cost, ca.units)[index]
    assert strict > 0


def test_empty_round_and_duplicate_ids(fam: ResNetFamily, cost: CostModel) -> None:
    ms = make(fam, cost)
    res = ms.assign_round([], 0)
    assert res.choices == () and res.hit_rate == 0.0
    with pytest.raises(ValueError):
        ms.assign_round([ClientView(1, 1), ClientView(1, 2)], 0)


# ------------------------------------------------------------------------------------------------------ issue 33
@pytest.mark.parametrize(
    ("config", "explore"),
    [
        (ModelSearchConfig(explore_probability=0.8), 0.8),  # App. E.1 / Fig. 10's reading of the paper's 0.8
        (ModelSearchConfig(explore_probability=0.2), 0.2),  # Algorithm 2's reading of the paper's 0.8
        (ModelSearchConfig(epsilon=0.8), 0.2),  # the deprecated alias keeps Algorithm 2's meaning
        (ModelSearchConfig(epsilon=0.2), 0.8),
        (ModelSearchConfig(), 0.2),  # neither: what the old default epsilon 0.8 meant
    ],
)
def test_explore_probability_is_the_frequency_of_exploring(
    fam: ResNetFamily, cost: CostModel, config: ModelSearchConfig, explore: float
) -> None:
    """Over many clients each test draws another structure with probability ``explore``: with t_max = 1 the share
    of clients that draw one, with t_max = 5 the mean number of draws (sum of explore^k, k = 1..5)."""
    assert config.explore == pytest.approx(explore)
    n = 4000
    views = [ClientView(i, 10) for i in range(n)]
    one = make(fam, cost, epsilon=config.stop_threshold, t_max=1).assign_round(views, 0)
    share = np.mean([c.draws for c in one.choices])
    assert abs(share - explore) < 4.0 * math.sqrt(explore * (1.0 - explore) / n)
    five = make(fam, cost, epsilon=config.stop_threshold, t_max=5).assign_round(views, 1)
    mean = np.mean([c.draws for c in five.choices])
    assert mean == pytest.approx(sum(explore**k for k in range(1, 6)), abs=0.1)
    assert np.mean([c.hit for c in five.choices]) == pytest.approx(explore**5, abs=0.03)


def test_setting_both_explore_probability_and_epsilon_is_refused() -> None:
    with pytest.raises(ValueError, match="set explore_probability only"):
        ModelSearchConfig(explore_probability=0.8, epsilon=0.2)


def test_a_band_budget_between_two_levels_lets_the_search_exceed_heterofls_model(
    fam: ResNetFamily, cost: CostModel
) -> None:
    """Two levels, HeteroFL's full model and its half-width model (their memory needs): a client of the lower level
    gets a memory budget strictly between the two, so HeteroFL's largest fitting rate stays 0.5 while the search
    finds structures with more parameters than the half-width model; with the exact level it cannot."""
    dims = len(fam.space.dims)
    half = fam.space.units([0.5] * dims)
    p_half, m_half, _ = needs(cost, half)
    _, m_full, _ = needs(cost, fam.full_units)
    cohort = np.arange(40)
    band = Levels((m_full, m_half), seed=0, purpose="memory", band=True).at(cohort, 0.0, 0)
    lower = band < m_full
    assert lower.sum() == 20 and ((band[lower] > m_half) & (band[lower] < m_full)).all()
    views = [ClientView(int(c), 10, float(b)) for c, b in zip(cohort[lower], band[lower], strict=True)]
    # HeteroFL's model for these clients: the largest of its rates (1, 0.5) that fits, 0.5
    assert all(needs(cost, fam.full_units)[1] > v.memory_budget >= m_half for v in views)
    chosen = make(fam, cost, ratios=(0.5, 1.0), epsilon=0.0, t_max=30).assign_round(views, 0).choices
    assert all(c.fits and c.params >= p_half for c in chosen)
    assert sum(c.params > p_half for c in chosen) >= len(chosen) // 2
    exact = [ClientView(v.client_id, 10, m_half) for v in views]
    chosen = make(fam, cost, ratios=(0.5, 1.0), epsilon=0.0, t_max=30).assign_round(exact, 0).choices
    assert all(c.params == p_half for c in chosen)  # at the exact level HeteroFL's model is the ceiling


def small_vit(depth: int) -> ViTFamily:
    return ViTFamily(ViTConfig(patch_size=8), embed_dim=16, depth=depth, heads=2, head_dim=8, mlp_dim=32)


def test_named_structures_equal_the_smaller_models_they_name() -> None:
    """Table 2's smallest client models: ResNet18 inside ResNet34 (the first two blocks of each stage) has exactly
    ResNet18's parameters and memory; ViT-tiny-tiny inside a ViT (its first block) a one-block ViT's."""
    widths = (4, 8, 16, 32)
    r34 = ResNetFamily(ResNetConfig(depth=34, widths=widths))
    r18 = ResNetFamily(ResNetConfig(depth=18, widths=widths))
    units = named_structure(r34, 1.0, (2, 2, 2, 2))
    c34, c18 = CostModel(r34, batch_size=8), CostModel(r18, batch_size=8)
    assert c34.model_cost(units)["params"] == c18.model_cost(r18.full_units)["params"]
    assert c34.model_cost(units)["peak_memory"] == pytest.approx(c18.model_cost(r18.full_units)["peak_memory"])
    vit = small_vit(4)
    one = small_vit(1)
    units = named_structure(vit, 1.0, (1,))
    assert units == (2, 32) + (0, 0) * 3
    assert CostModel(vit, 8).model_cost(units)["params"] == CostModel(one, 8).model_cost(one.full_units)["params"]
    assert named_structure(r18, 0.0625, ()) == r18.space.units([0.0625] * len(r18.space.dims))  # HeteroFL's smallest
    with pytest.raises(ValueError, match="one count per stage"):
        named_structure(r34, 1.0, (2, 2))
    with pytest.raises(ValueError, match="cannot be removed"):
        named_structure(r34, 1.0, (2, 0, 2, 2))  # stage 2's first block changes the stream's shape
    search = ModelSearch(r34.space, c34, (0.0, 0.5, 1.0), smallest=named_structure(r34, 1.0, (2, 2, 2, 2)), seed=0)
    assert search.smallest == named_structure(r34, 1.0, (2, 2, 2, 2)) and search.pool()[-1] == search.smallest
    floor_memory = needs(c34, search.floor)[1]
    below, nothing = search.assign_round([ClientView(0, 10, floor_memory), ClientView(1, 10, 1.0, 1.0)], 0).choices
    assert below.fits and below.units == search.floor  # the space's smallest when the named model does not fit
    assert not nothing.fits and nothing.units == search.smallest  # nothing fits: the named model, failing


def test_layer_granularity_gives_a_transformer_block_one_ratio() -> None:
    """``granularity: layer``: a block's heads and MLP share one ratio of S (0 removes the whole block); the finer
    space draws them apart."""
    vit = small_vit(4)
    cost = CostModel(vit, 8)
    views = [ClientView(i, 10) for i in range(300)]
    tied = ModelSearch(vit.space, cost, (0.0, 0.5, 1.0), epsilon=0.0, t_max=3, groups=vit.layer_groups(), seed=1)
    free = ModelSearch(vit.space, cost, (0.0, 0.5, 1.0), epsilon=0.0, t_max=3, seed=1)
    for search, same in ((tied, True), (free, False)):
        search.assign_round(views, 0)
        pool = np.array(search.pool())
        ratio_heads, ratio_mlp = pool[:, 0::2] / 2, pool[:, 1::2] / 32
        assert (ratio_heads == ratio_mlp).all() == same
    assert len(tied.pool()) <= 3**4 < len(free.pool())
