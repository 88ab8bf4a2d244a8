"""FedorAS's per-tier fine-tuning: realised paths, supernet vs random initialisation, eligibility (tier t's model on
tiers >= t only), the cohort split, tiers by compute, and the per-tier report."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.config.model import SupernetConfig
from rayfl.config.sections import ResourceConfig, SystemConfig
from rayfl.core.errors import ConfigError
from rayfl.engine.build import bind_algorithm, build_clock, build_setup
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import PhaseConfig
from rayfl.fl.common.multimodel import initial_model_params, model_params
from rayfl.fl.methods.fedoras.algorithm import op_tables, supernet_family
from rayfl.fl.methods.fedoras.config import FedorASFinetuneConfig
from rayfl.fl.methods.fedoras.finetune import FedorASFinetune, FinetuneState, split_cohort
from rayfl.fl.methods.fedoras.sampling import path_flops, tiers_by_compute, tiers_by_shares
from rayfl.models import InputSpec
from rayfl.models.elastic.cost import CostModel
from rayfl.models.supernet import SupernetFamily
from tests.helpers import tiny_image_dataset
from tests.helpers_fedoras import TINY_TIERS, fedoras_tiny_config

SPEC = InputSpec("image", 4, (3, 8, 8), {"mean": [0.5] * 3, "std": [0.25] * 3})


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """The tiny three-phase run (2 supernet rounds, 3 search rounds, 2 fine-tuning rounds), written to disk."""
    cfg = dataclasses.replace(
        fedoras_tiny_config(kind="local", num_hosts=2), output_dir=str(tmp_path_factory.mktemp("runs"))
    )
    return run_experiment(cfg, write=True, dataset=tiny_image_dataset())


def test_split_cohort_serves_the_scarce_tiers_first_and_respects_eligibility() -> None:
    """By hand: 8 clients, two per tier, 4 models. Model 3 may take ceil(8/4) = 2 and only the two tier-3 clients
    qualify; model 2 then takes ceil(6/3) = 2 of the tier >= 2 clients left (the tier-2 ones), model 1 ceil(4/2) = 2
    (tier 1), model 0 the rest: every client trains its own tier's model, whatever the random order."""
    tiers = np.array([3, 3, 0, 1, 2, 0, 1, 2])
    for seed in range(5):
        assert split_cohort(tiers, 4, np.random.default_rng(seed)).tolist() == tiers.tolist()
    # four top-tier clients: one per model
    assert sorted(split_cohort(np.array([3, 3, 3, 3]), 4, np.random.default_rng(0)).tolist()) == [0, 1, 2, 3]
    rng = np.random.default_rng(1)
    for _ in range(200):
        cohort = rng.integers(0, 4, size=int(rng.integers(1, 12)))
        models = split_cohort(cohort, 4, rng)
        assert (models >= 0).all() and (models <= cohort).all()  # never a model above the client's tier
        counts = np.bincount(models, minlength=4)
        # a model gets no more than its share, rounded up, of the clients left when its turn came
        assert counts[3] <= -(-len(cohort) // 4)


def test_tiers_by_compute_rank_clients_slowest_first() -> None:
    """By hand: speeds 5, 1, 3, 2, 9, 4 in thirds: {1, 2} -> clients 1, 3; {3, 4} -> 2, 5; {5, 9} -> 0, 4."""
    tiers = tiers_by_compute(np.array([5.0, 1.0, 3.0, 2.0, 9.0, 4.0]), (1 / 3, 1 / 3, 1 / 3), np.random.default_rng(0))
    assert tiers.tolist() == [2, 0, 1, 0, 2, 1]
    same = tiers_by_compute(np.full(10, 7.0), (0.5, 0.5), np.random.default_rng(4))
    assert np.array_equal(same, tiers_by_shares(10, (0.5, 0.5), np.random.default_rng(4)))  # ties: the shuffle


def test_realised_path_is_the_supernet_sub_model_with_its_costs() -> None:
    """``model.path`` builds exactly the path's ops under the supernet's names; the cost model prices it as the op
    tables price the path inside the supernet."""
    cfg = SupernetConfig(stem_channels=4, blocks_per_stage=(2, 1), ops=("conv1", "ds3_e1", "mb3_e2", "identity"))
    supernet = SupernetFamily(cfg, in_channels=3, num_classes=4, image_size=8)
    tables = op_tables(supernet, CostModel(supernet, 5, use_disk_cache=False))
    path = np.array([2, 3, 1])
    realised = SupernetFamily(dataclasses.replace(cfg, path=("mb3_e2", "identity", "ds3_e1")), 3, 4, image_size=8)
    model = realised.global_model()
    sub = supernet.build(supernet.units_of_path(path))
    assert list(model.state_dict()) == list(sub.state_dict())
    assert all(not k.startswith(("layers.0.0", "layers.0.1", "layers.1.", "layers.2.0")) for k in model.state_dict())
    cost = CostModel(realised, 5, use_disk_cache=False).evaluate(np.array([realised.full_units]))
    assert cost.flops[0] == path_flops(tables, path)[0]
    assert cost.params[0] == tables.fixed_params + tables.params[np.arange(3), path].sum()
    with pytest.raises(ValueError, match=r"not among model\.ops"):
        SupernetFamily(dataclasses.replace(cfg, path=("mb3_e2", "identity", "mb5_e9")), 3, 4, image_size=8)


def test_searched_paths_become_tier_models_with_supernet_weights(searched: RunResult) -> None:
    """The fine-tuning phase's models are the search's best paths, eligibility holds in every round, and the report
    and records give each tier's model."""
    state = searched.state.algo_state
    assert isinstance(state, FinetuneState) and state.init == "supernet"
    assert [m.path for m in searched.state.models] == [
        tuple(("conv1", "ds3_e1", "mb3_e2", "identity")[o] for o in p) for p in state.paths
    ]
    tiers = state.tiers.client_tier
    run_dir = searched.run_dir
    assert run_dir is not None
    clients = pd.read_csv(run_dir / "clients.csv")
    tuned = clients[clients.round_idx >= 5]
    assert len(tuned) == 8 and (tuned.model_id.to_numpy() <= tiers[tuned.client_id.to_numpy()]).all()
    last = searched.records[-1]
    assert last.num_models == 4 and last.phase == "finetune"
    accs = [float(a) for a in last.model_accs.split()]
    summary = json.loads((run_dir / "summary.json").read_text())
    result = summary["phases"][2]["result"]
    assert [t["test_acc"] for t in result["tiers"]] == accs  # the report's accuracies are the engine's
    assert [t["eligible_clients"] for t in result["tiers"]] == [int((tiers >= t).sum()) for t in range(4)]
    search = summary["phases"][1]["result"]["tiers"]
    assert [t["path"] for t in result["tiers"]] == [t["path"] for t in search]
    assert [t["flops"] for t in result["tiers"]] == [t["flops"] for t in search]
    evals = pd.read_csv(run_dir / "evals.csv")
    assert set(evals[evals.round_idx == 6].name) == {"tier1", "tier2", "tier3"}


def test_supernet_init_copies_by_name_and_rand_init_draws_afresh() -> None:
    """Entering the phase: ``init: supernet`` gives each tier model the supernet's tensors of its path; ``init: random``
    the seeded fresh weights of the same architecture."""
    base = fedoras_tiny_config(kind="local", num_hosts=1)
    cfg = dataclasses.replace(base, rounds=5, phases=base.phases[:2])
    result = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    for init in ("supernet", "random"):
        finetune = PhaseConfig(name="finetune", rounds=2, algorithm=FedorASFinetuneConfig(init=init))  # type: ignore[arg-type]
        tuned = dataclasses.replace(base, phases=(*base.phases[:2], finetune))
        setup = build_setup(tuned, tiny_image_dataset())
        bind_algorithm(tuned, setup, build_clock(tuned, setup))
        algorithm = setup.algorithm.phases[2].algorithm  # type: ignore[attr-defined]
        assert isinstance(algorithm, FedorASFinetune)
        state = algorithm.enter_phase(result.state, 5)
        assert state.round_idx == 5 and len(state.models) == 4
        for model_id, config in enumerate(state.models):
            own = model_params(state.params, model_id)
            expected = (
                {k: result.state.params[k] for k in own}
                if init == "supernet"
                else initial_model_params(config, setup.input_spec, tuned.seed, model_id)
            )
            assert list(own) == list(expected)
            assert all(torch.equal(own[k], expected[k]) for k in own)
        if init == "random":
            assert not all(torch.equal(v, result.state.params[k]) for k, v in model_params(state.params, 0).items())


def test_random_architectures_and_compute_tiers_in_a_fine_tuning_only_run() -> None:
    """The tier-aware FedAvg baseline as a run of its own: tiers by compute speed (levels fixed by client id, so the
    tiers are the id ranges), one random in-bracket path per tier, random initialisation."""
    base = fedoras_tiny_config(kind="local", num_hosts=1)
    tiers = dataclasses.replace(TINY_TIERS, by="compute")
    cfg = dataclasses.replace(
        base,
        rounds=2,
        system=SystemConfig(
            compute=ResourceConfig(source="levels", values=(10.0, 20.0, 30.0, 40.0), id_bounds=(3, 6, 9))
        ),
        phases=(
            PhaseConfig(
                name="tier-aware",
                rounds=2,
                algorithm=FedorASFinetuneConfig(architectures="random", init="random", tiers=tiers),
            ),
        ),
    )
    result = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    state = result.state.algo_state
    assert isinstance(state, FinetuneState)
    assert state.tiers.client_tier.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    oracle = build_clock(cfg, build_setup(cfg, tiny_image_dataset())).oracle
    assert oracle.elastic is not None
    tables = op_tables(supernet_family(oracle.family), oracle.elastic)
    for tier, path in enumerate(state.paths):
        assert state.tiers.edges[tier] <= path_flops(tables, np.array(path))[0] <= state.tiers.edges[tier + 1]
    assert all(np.isfinite(r.train_loss) for r in result.records)


@pytest.mark.parametrize(
    ("phases", "message"),
    [
        ("  - {name: f, rounds: 2, algorithm: {name: fedoras_finetune}}\n", "needs its own tiers"),
        (
            "  - {name: f, rounds: 2, algorithm: {name: fedoras_finetune, init: random, tiers: {shares: [1.0]}}}\n",
            "'searched' must follow a 'fedoras_search' phase",
        ),
        (
            "  - {name: s, rounds: 1, algorithm: {name: fedoras}}\n"
            "  - {name: f, rounds: 1, algorithm: {name: fedoras_finetune, tiers: {shares: [1.0]}}}\n",
            "inherited from the fedoras phase",
        ),
        (
            "  - {name: s, rounds: 1, algorithm: {name: fedoras}}\n"
            "  - {name: f, rounds: 1, algorithm: {name: fedoras_finetune, architectures: given, paths: [[conv1]]}}\n",
            "one path per tier \\(4\\)",
        ),
        (
            "  - {name: f, rounds: 2, algorithm: {name: fedoras_finetune, init: random, architectures: random,"
            " tiers: {by: compute}}}\n",
            "gives every client the same speed",
        ),
    ],
)
def test_fine_tuning_configs_are_checked(tmp_path: Path, phases: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"rounds: 2\ndata: {{name: synthetic}}\nmodel: {{name: supernet}}\nphases:\n{phases}", "utf-8")
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_a_single_section_fine_tuning_without_tiers_is_one_clear_error(tmp_path: Path) -> None:
    """Without phases there is no fedoras phase to inherit tiers from: the missing ``tiers`` is the one error (this
    raised IndexError while counting the given paths against inherited tiers)."""
    path = tmp_path / "bad.yaml"
    algorithm = "{name: fedoras_finetune, architectures: given, paths: [[conv1]]}"
    text = f"rounds: 2\ndata: {{name: synthetic}}\nmodel: {{name: supernet}}\nalgorithm: {algorithm}\n"
    path.write_text(text, "utf-8")
    with pytest.raises(ConfigError, match=r"algorithm\.tiers: .*needs its own tiers"):
        load_config(path)


def test_a_realised_path_model_trains_with_fedavg() -> None:
    """``model.path`` is an ordinary fixed architecture for any method (the rand-init of one path, by hand)."""
    base = fedoras_tiny_config(kind="local", num_hosts=1)
    model = dataclasses.replace(base.model, path=("mb3_e2", "identity", "ds3_e1"))
    cfg = dataclasses.replace(base, model=model, phases=(), rounds=2)
    result = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    assert not any(k.startswith("layers.0.0") for k in result.state.params)
    assert all(np.isfinite(r.test_acc) for r in result.records)


def test_report_lists_the_phases_and_each_tier_model(searched: RunResult, tmp_path: Path) -> None:
    from rayfl.report import report

    assert searched.run_dir is not None
    markdown, _ = report([searched.run_dir], tmp_path)
    result = json.loads((searched.run_dir / "summary.json").read_text())["phases"][2]["result"]
    assert "| finetune | fedoras_finetune | 2 |" in markdown
    assert "Per tier, phase finetune (architectures: searched, init: supernet):" in markdown
    for t in result["tiers"]:
        assert f"| {t['tier']} | {t['clients']} | {t['eligible_clients']} |" in markdown
        assert f"{100 * t['test_acc']:.1f}% | {' '.join(t['path'])} |" in markdown


def test_random_architecture_draws_for_the_random_search_baseline() -> None:
    """``draw`` 0 keeps the tier-aware baseline's paths (the generator keys it always had); draws 1 and 2 are other
    in-bracket paths (paper 003 App. E trains several draws from scratch); a draw needs ``architectures: random``."""
    from rayfl.core.rng import derive_rng
    from rayfl.fl.methods.fedoras.sampling import sample_paths_in_bracket

    base = fedoras_tiny_config(kind="local", num_hosts=1)
    paths: dict[int, list[tuple[int, ...]]] = {}
    for draw in (0, 1, 2):
        algo = FedorASFinetuneConfig(architectures="random", init="random", tiers=TINY_TIERS, draw=draw)
        cfg = dataclasses.replace(base, rounds=1, phases=(PhaseConfig(name="tier-aware", rounds=1, algorithm=algo),))
        setup = build_setup(cfg, tiny_image_dataset())
        bind_algorithm(cfg, setup, build_clock(cfg, setup))
        algorithm = setup.algorithm.phases[0].algorithm  # type: ignore[attr-defined]
        assert isinstance(algorithm, FedorASFinetune)
        state = algorithm.init_state({})
        assert isinstance(state.algo_state, FinetuneState)
        tiers = state.algo_state.tiers
        paths[draw] = [tuple(p) for p in state.algo_state.paths]
        for tier, path in enumerate(paths[draw]):
            assert tiers.edges[tier] <= path_flops(algorithm.tables, np.array(path))[0] <= tiers.edges[tier + 1]
        if draw == 0:
            old = [
                tuple(
                    sample_paths_in_bracket(
                        algorithm.tables,
                        1,
                        tiers.edges[t],
                        tiers.edges[t + 1],
                        derive_rng(cfg.seed, "fedoras-random-architecture", t),
                    )[0]
                )
                for t in range(tiers.num_tiers)
            ]
            assert paths[0] == old
    assert paths[1] != paths[0] and paths[2] != paths[0] and paths[1] != paths[2]
    with pytest.raises(ConfigError, match="draw"):
        load_config(
            None,
            [
                "data.name=synthetic",
                "model.name=supernet",
                "algorithm.name=fedoras_finetune",
                "algorithm.architectures=given",
                "algorithm.init=random",
                f"algorithm.paths=[{','.join(['[' + ','.join(['identity'] * 6) + ']'] * 2)}]",
                "algorithm.draw=1",
                "algorithm.tiers.shares=[0.5,0.5]",
            ],
        )
