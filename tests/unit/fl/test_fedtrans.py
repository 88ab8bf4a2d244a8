"""FedTrans (paper 002) with hand-computed values: DoC (Eq. 1), similarity of a three-model family, one utility update
(Eq. 4), one soft aggregation with cropping and decay (Eq. 5), Eq. 3's sampling frequencies, and the transformation
rule (cells above alpha x max; widen, then deepen the cell next time); compatibility from the cost oracle against
hand budgets, a transformation fired by the DoC of hand-set losses, the cropping's rescaling across a widening, and
FedTrans with one model equal to FedAvg bit for bit."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from rayfl.config.model import CellNetConfig
from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Aggregate, ClientOutcome, ClientView, ServerState
from rayfl.core.rng import derive_rng
from rayfl.engine.exec.client_state import initial_weights
from rayfl.fl.api.algorithm import ServerContext
from rayfl.fl.common.multimodel import model_key
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedtrans.algorithm import ACTIVENESS_PREFIX, FedTrans, FedTransState
from rayfl.fl.methods.fedtrans.config import FedTransConfig
from rayfl.fl.methods.fedtrans.equations import (
    degree_of_convergence,
    family_similarity,
    input_scales,
    model_similarity,
    sample_model,
    select_cells,
    soft_aggregate,
    softmax,
    update_utilities,
)
from rayfl.models import InputSpec, build_model
from rayfl.models.cellnet.transform import build_graph, transform_params
from rayfl.system.costs import CostOracle
from tests.helpers import tiny_config, tiny_image_dataset


def test_degree_of_convergence_on_a_hand_made_loss_sequence() -> None:
    losses = [2.0, 1.8, 1.5, 1.4, 1.35, 1.3]
    # gamma 2, step 2: slopes (L2 - L4) / 2 = 0.075 and (L3 - L5) / 2 = 0.05
    assert degree_of_convergence(losses, gamma=2, step=2) == pytest.approx(0.0625)
    # gamma 3, step 1: 0.1, 0.05, 0.05
    assert degree_of_convergence(losses, gamma=3, step=1) == pytest.approx(0.2 / 3)
    assert math.isnan(degree_of_convergence(losses[:3], gamma=2, step=2))  # needs gamma + step losses
    assert degree_of_convergence([1.0, 1.1, 1.3], gamma=1, step=2) == pytest.approx(-0.15)  # signed: a rising loss


def _family() -> tuple[list[object], list[tuple[str, ...]]]:
    """M0: conv 3->2, conv 2->4, linear 4->10 (no norms, biases); M1 = M0 + widen c1 x2; M2 = M1 + deepen c2."""
    logs = [(), ("widen c1 2",), ("widen c1 2", "deepen c2")]
    graphs = [build_graph(CellNetConfig(channels=(2, 4), norm="none", transforms=t), 3, 10, 8) for t in logs]
    return graphs, logs


def test_similarity_of_a_hand_built_three_model_family() -> None:
    graphs, logs = _family()
    # cell parameters: M0 c1 2*3*9+2 = 56, c2 4*2*9+4 = 76, head 40+10 = 50; M1 c1 112, c2 4*4*9+4 = 148;
    # M2 adds c2_d1 (4*4*9+4 = 148, inserted: mc 0)
    s01 = (56 / 112 + 76 / 148 + 1.0) / 3
    s02 = (56 / 112 + 76 / 148 + 0.0 + 1.0) / 4
    s12 = (1.0 + 1.0 + 0.0 + 1.0) / 4
    sim = family_similarity(graphs, logs)  # type: ignore[arg-type]
    np.testing.assert_allclose(sim, [[1.0, s01, s02], [s01, 1.0, s12], [s02, s12, 1.0]], rtol=1e-12)
    assert model_similarity(graphs[1], graphs[2], reset_between=True) == 0.0  # every cell lost its weights: -1, clip
    reset = family_similarity(graphs, [logs[0], logs[1], (*logs[2], "reset")])  # type: ignore[arg-type]
    assert reset[1, 2] == 0.0 and reset[0, 2] == 0.0 and reset[0, 1] == pytest.approx(s01)


def test_one_utility_update() -> None:
    sim = np.array([[1.0, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 1.0]])
    before = np.zeros((3, 3))
    # client 0 trained model 0 (loss 1), client 2 model 2 (loss 3): z = -1 and +1; client 1 did not train
    after = update_utilities(before, np.array([0, 2]), np.array([0, 2]), np.array([1.0, 3.0]), sim)
    np.testing.assert_allclose(after, [[1.0, 0.5, 0.25], [0.0, 0.0, 0.0], [-0.25, -0.5, -1.0]])
    assert after is not before and before.sum() == 0.0
    single = update_utilities(before, np.array([1]), np.array([1]), np.array([2.0]), sim)
    np.testing.assert_array_equal(single, before)  # one loss standardises to 0


def test_one_soft_aggregation_with_cropping_and_decay() -> None:
    means = {
        0: {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([1.0, 1.0])},
        1: {"w": torch.full((3, 4), 10.0), "b": torch.tensor([4.0, 4.0, 4.0])},
    }
    a01 = 0.9**2 * 0.5  # eta^t sim, t = 2 rounds model 1 has trained
    out = soft_aggregate(means, {(0, 0): 1.0, (1, 1): 1.0, (0, 1): a01})
    expected = torch.full((3, 4), 10.0)
    expected[:2, :2] = (10.0 + a01 * torch.tensor([[1.0, 2.0], [3.0, 4.0]])) / (1.0 + a01)
    torch.testing.assert_close(out[1]["w"], expected, rtol=1e-7, atol=0)
    torch.testing.assert_close(out[1]["b"], torch.tensor([(4 + a01) / (1 + a01)] * 2 + [4.0]), rtol=1e-7, atol=0)
    torch.testing.assert_close(out[0]["w"], means[0]["w"])  # no large-to-small sharing listed: model 0 is its own
    shared = soft_aggregate(means, {(0, 0): 1.0, (1, 1): 1.0, (1, 0): 0.25})  # "l2s": the larger one cropped
    torch.testing.assert_close(shared[0]["w"], (torch.tensor([[1.0, 2.0], [3.0, 4.0]]) + 2.5) / 1.25)
    with pytest.raises(ValueError):
        soft_aggregate(means, {(0, 1): 1.0})


def test_fedtrans_aggregation_uses_eta_to_the_rounds_the_receiver_trained() -> None:
    algo = FedTrans(FedTransConfig(eta=0.5), TrainConfig())
    sim = np.array([[1.0, 0.4], [0.4, 1.0]])
    fs = FedTransState(utilities=np.zeros((1, 2)), similarity=sim, trained_rounds=(7, 3))
    params = {"w": torch.tensor([2.0]), "m1/w": torch.tensor([8.0, 8.0]), "m1/x": torch.tensor([1.0])}
    out = algo._aggregate(params, [0, 1], fs)
    a = 0.5**3 * 0.4
    assert list(out) == list(params)  # the flat dict keeps its order
    torch.testing.assert_close(out["m1/w"], torch.tensor([(8 + 2 * a) / (1 + a), 8.0]))
    assert torch.equal(out["w"], params["w"]) and torch.equal(out["m1/x"], params["m1/x"])
    alone = algo._aggregate(params, [1], fs)  # model 0 had no clients: nothing to share
    assert all(torch.equal(alone[k], params[k]) for k in params)


def test_sampling_frequencies_match_eq3() -> None:
    utilities = np.array([0.0, 1.0, -0.5])
    for candidates in (np.array([0, 1, 2]), np.array([0, 2])):
        p = softmax(utilities[candidates])
        draws = 10_000
        picks = [sample_model(utilities, candidates, derive_rng(3, "eq3", d)) for d in range(draws)]
        counts = np.array([picks.count(int(c)) for c in candidates])
        sd = np.sqrt(draws * p * (1 - p))
        assert np.all(np.abs(counts - draws * p) <= 4 * sd), (counts, draws * p)


def test_cells_above_alpha_max_are_picked() -> None:
    act = {"c1": 0.2, "c2": 1.0, "c3": 0.91, "head": 0.5}
    assert select_cells(act, 0.9) == ["c2", "c3"]
    assert select_cells(act, 0.0) == list(act)
    assert select_cells({}, 0.9) == []


def test_a_cell_widened_last_time_is_deepened_and_a_dimension_is_widened_once() -> None:
    algo = FedTrans(FedTransConfig(widen_factor=3), TrainConfig())
    cnn = build_graph(CellNetConfig(channels=(4, 8, 8)), 3, 10, 8)
    steps, widened = algo._steps(cnn, ["c1", "c2"], frozenset({"c2", "c3"}))
    assert steps == ("widen c1 3", "deepen c2") and widened == {"c1", "c3"}  # c3 stays widened until deepened
    steps, widened = algo._steps(cnn, ["c1", "c2"], widened)
    assert steps == ("deepen c1", "widen c2 3") and widened == {"c2", "c3"}  # alternation per cell
    resnet = build_graph(CellNetConfig(base="resnet", channels=(4, 4, 8, 8)), 3, 10, 32)
    steps, widened = algo._steps(resnet, ["s2b1c2", "s2b1sc", "s2b2c2"], frozenset())
    assert steps == ("widen s2b1c2 3",) and widened == {"s2b1c2"}  # all three write stage 2's stream


def test_a_new_model_copies_its_parents_utilities_and_extends_the_log() -> None:
    cfg = CellNetConfig(channels=(4, 8), norm="none")
    spec = InputSpec("image", 4, (3, 8, 8))
    algo = FedTrans(FedTransConfig(alpha=0.5, noise=0.0), TrainConfig())
    algo.bind_server(ServerContext(0, 3, 2, spec, None, None, tiny_image_dataset(num_clients=3), model=cfg))
    state = algo.init_state(initial_weights(cfg, spec, 0))
    fs = dataclasses.replace(
        algo._state(state),
        utilities=np.array([[0.5], [-1.0], [2.0]]),
        activeness=((("c1", 1.0), ("c2", 0.4), ("head", 2.0)),),  # the classifier is no candidate
        doc=0.001,
    )
    new = algo._transform(dataclasses.replace(state, algo_state=fs), round_idx=4, forced=False)
    nfs = algo._state(new)
    assert [m.transforms for m in new.models] == [(), ("widen c1 2",)]  # type: ignore[union-attr]
    np.testing.assert_array_equal(nfs.utilities, [[0.5, 0.5], [-1.0, -1.0], [2.0, 2.0]])
    assert nfs.trained_rounds == (0, 0) and nfs.losses == () and nfs.activeness == () and nfs.widened == {"c1"}
    event = nfs.log[0]
    assert (event.round_idx, event.parent, event.child, event.doc) == (4, 0, 1, 0.001)
    assert new.params["m1/layers.c1.weight"].shape == (8, 3, 3, 3)
    assert 0.0 < nfs.similarity[0, 1] < 1.0


# ---------------------------------------------------------------------------------------------------- helpers
_SPEC = InputSpec("image", 4, (3, 8, 8))
_BASE = CellNetConfig(channels=(2, 4), norm="none")
_LOGS: tuple[tuple[str, ...], ...] = ((), ("widen c1 2",), ("widen c1 2", "deepen c2"))


def _bound(config: FedTransConfig, train: TrainConfig, rounds: int = 10) -> FedTrans:
    """A FedTrans server side bound to a 3-client data set and the clock's cost oracle for ``_BASE``."""
    algo = FedTrans(config, train)
    shapes = {k: tuple(v.shape) for k, v in initial_weights(_BASE, _SPEC, 0).items()}
    oracle = CostOracle(_BASE, _SPEC, train, shapes)
    algo.bind_server(
        ServerContext(0, rounds, 3, _SPEC, None, None, tiny_image_dataset(num_clients=3), model=_BASE, oracle=oracle)
    )
    return algo


def _family_state(algo: FedTrans, logs: Sequence[tuple[str, ...]], fs: FedTransState) -> ServerState:
    """A state holding the models of ``logs`` (each the transformation of the previous one, noise-free)."""
    models = tuple(dataclasses.replace(_BASE, transforms=t) for t in logs)
    tensors = initial_weights(_BASE, _SPEC, 0)
    graph = algo._graph(_BASE)
    params = dict(tensors)
    for k in range(1, len(logs)):
        for step in logs[k][len(logs[k - 1]) :]:
            graph, tensors = transform_params(graph, tensors, step)
        params.update({model_key(k, name): t for name, t in tensors.items()})
    return ServerState(params=params, models=models, algo_state=fs)


# ------------------------------------------------------------------------------------ compatibility (Sec. 4.2)
def test_compatible_models_and_the_client_model_from_the_cost_oracle_and_hand_budgets() -> None:
    train = TrainConfig(batch_size=5)  # one epoch: a client of 10 samples processes 10
    algo = _bound(FedTransConfig(), train)
    # forward MACs by hand (8x8 image, max-pool after c1): c1 2*3*9*64 = 3456, c2 4*2*9*16 = 1152, head 4*4 = 16;
    # widen c1 x2: 6912 + 2304 + 16; deepen c2 adds 4*4*9*16 = 2304. Training FLOPs = 3 x 2 FLOPs per MAC.
    per_sample = [6.0 * 4624, 6.0 * 9232, 6.0 * 11536]
    assert [algo._flops_per_sample(dataclasses.replace(_BASE, transforms=t)) for t in _LOGS] == per_sample
    need = [10 * f for f in per_sample]
    fs = FedTransState(utilities=np.array([[0.3, 0.3, 0.1], [0.1, 0.5, 0.9], [0.0, 2.0, 1.0]]), similarity=np.eye(3))
    state = _family_state(algo, _LOGS, fs)

    def view(client: int, budget: float) -> ClientView:
        return ClientView(client, 10, compute_budget=budget)

    for budget, fits in (
        (math.inf, [0, 1, 2]),
        (need[2], [0, 1, 2]),  # a need equal to the budget fits
        (need[2] - 1.0, [0, 1]),
        (need[1], [0, 1]),
        (need[0], [0]),
        (need[0] - 1.0, [0]),  # nothing fits: model 0, as the author code
        (0.0, [0]),
    ):
        assert algo.compatible(state, view(1, budget)).tolist() == fits, budget
    assert algo.client_model(state, view(0, math.inf)) == 0  # utilities 0.3, 0.3, 0.1: the tie goes to the smaller
    assert algo.client_model(state, view(1, math.inf)) == 2
    assert algo.client_model(state, view(1, need[1])) == 1  # the best of the compatible ones, not of all
    assert algo.client_model(state, view(1, need[0] - 1.0)) == 0  # none fits: model 0
    assert algo.client_model(state, view(2, math.inf)) == 1
    assignments = algo.assign(state, 0, [view(1, need[0] - 1.0), view(2, need[1])])
    assert assignments[1].model_id == 0 and assignments[2].model_id in (0, 1)


# ------------------------------------------------------------------------------------ DoC fires (Algorithm 1)
def _outcome(client: int, model: int, loss: float, act: dict[str, float]) -> ClientOutcome:
    metrics = {f"{ACTIVENESS_PREFIX}{name}": value for name, value in act.items()}
    return ClientOutcome(
        client_id=client,
        num_examples=10,
        train_loss=loss,
        num_steps=2,
        bytes_down=0,
        bytes_up=0,
        model_id=model,
        metrics=metrics,
    )


def test_a_transformation_fires_when_the_newest_models_doc_reaches_beta() -> None:
    algo = _bound(FedTransConfig(gamma=2, doc_step=1, beta=0.01, alpha=0.9, noise=0.0), TrainConfig())
    logs = _LOGS[:2]  # model 1 = model 0 with c1 widened: c1 is deepened when picked next
    graphs = [algo._graph(dataclasses.replace(_BASE, transforms=t)) for t in logs]
    fs = FedTransState(
        utilities=np.array([[0.0, 0.0], [0.2, -0.1], [0.0, 0.4]]),
        similarity=family_similarity(graphs, list(logs)),
        losses=(1.0, 0.9),  # model 1's loss in the two rounds it has trained
        activeness=((("c1", 1.0), ("c2", 0.5)),),
        widened=frozenset({"c1"}),
        trained_rounds=(5, 2),
    )
    state = _family_state(algo, logs, fs)
    act = {"c1": 1.0, "c2": 0.4, "head": 3.0}  # the classifier is no candidate; c1 is the most active cell
    # round 3: model 0's client reports a loss far off model 1's; it must not enter model 1's DoC
    outcomes = (_outcome(0, 0, 5.0, act), _outcome(1, 1, 0.895, act), _outcome(2, 1, 0.895, act))
    after3 = algo.server_update(state, 3, Aggregate(state.params, {}, 3, outcomes))
    fs3 = algo._state(after3)
    assert len(after3.models) == 2 and fs3.losses == pytest.approx((1.0, 0.9, 0.895))
    assert fs3.doc == pytest.approx((0.1 + 0.005) / 2)  # slopes L0 - L1, L1 - L2: above beta
    assert fs3.trained_rounds == (6, 3)
    # round 4: model 1's clients average 0.89 (model 0's 0.1 again ignored): slopes 0.005, 0.005 <= beta
    outcomes = (_outcome(0, 0, 0.1, act), _outcome(1, 1, 0.88, act), _outcome(2, 1, 0.90, act))
    after4 = algo.server_update(after3, 4, Aggregate(after3.params, {}, 3, outcomes))
    fs4 = algo._state(after4)
    assert [m.transforms for m in after4.models] == [*logs, ("widen c1 2", "deepen c1")]  # type: ignore[union-attr]
    event = fs4.log[-1]
    assert (event.round_idx, event.parent, event.child, event.forced) == (4, 1, 2, False)
    assert event.doc == pytest.approx(0.005)
    assert fs4.trained_rounds == (7, 4, 0) and fs4.losses == () and fs4.activeness == () and math.isnan(fs4.doc)
    expected = update_utilities(
        fs3.utilities, np.array([0, 1, 2]), np.array([0, 1, 1]), np.array([0.1, 0.88, 0.90]), fs3.similarity
    )
    np.testing.assert_array_equal(fs4.utilities[:, :2], expected)
    np.testing.assert_array_equal(fs4.utilities[:, 2], expected[:, 1])  # the child's column is the parent's
    assert not np.array_equal(expected[:, 1], fs3.utilities[:, 1])  # ... after this round's update
    # the same round as the run's last one makes no model: nobody could train it
    last = _bound(dataclasses.replace(algo.config), TrainConfig(), rounds=5)
    assert len(last.server_update(after3, 4, Aggregate(after3.params, {}, 3, outcomes)).models) == 2


def test_a_forced_round_without_activeness_is_skipped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    algo = _bound(FedTransConfig(force_rounds=(2,)), TrainConfig())
    fs = FedTransState(utilities=np.zeros((3, 2)), similarity=np.eye(2), trained_rounds=(2, 0))
    state = _family_state(algo, _LOGS[:2], fs)
    outcomes = (_outcome(0, 0, 1.0, {"c1": 1.0}),)  # model 1, the newest, has not trained since it was made
    with caplog.at_level("WARNING", logger="rayfl.fl.methods.fedtrans.algorithm"):
        new = algo.server_update(state, 2, Aggregate(state.params, {}, 1, outcomes))
    assert len(new.models) == 2
    assert "no transformation after round 2" in caplog.text


# ------------------------------------------------------------------------------------ cropping across a widening
def test_averaging_a_model_with_its_widened_copy_keeps_the_function_only_with_rescaling() -> None:
    """Widen c1 and c2 x2 (batch norm, a 2x2 pooled map before the classifier, so the head reads channel-major runs of
    4 features): parent and noise-free child compute the same function, so their Eq. 5 average must too. The paper's
    literal crop adds the parent's full-scale input columns into the child's columns that hold them divided by 2."""
    base = CellNetConfig(channels=(2, 4), norm="batch", head_pool=2)
    logs = ("widen c1 2", "widen c2 2")
    parent_graph = build_graph(base, 3, 4, 8)
    parent = initial_weights(base, _SPEC, 0)
    graph, child = parent_graph, dict(parent)
    for step in logs:
        graph, child = transform_params(graph, child, step)
    scales = input_scales(parent_graph, graph)
    assert scales == {"layers.c2.weight": 0.5, "layers.head.weight": 0.5}
    assert input_scales(graph, parent_graph) == {"layers.c2.weight": 2.0, "layers.head.weight": 2.0}
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(0))

    def outputs(config: CellNetConfig, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        model = build_model(config, _SPEC)
        model.load_state_dict(tensors, strict=False)
        return model.eval()(x).detach()

    child_cfg = dataclasses.replace(base, transforms=logs)
    reference = outputs(base, parent)
    assert (outputs(child_cfg, child) - reference).abs().max() <= 1e-5
    coefficients = {(0, 0): 1.0, (1, 1): 1.0, (0, 1): 0.7}
    rescaled = soft_aggregate({0: parent, 1: child}, coefficients, {(0, 1): scales})[1]
    assert (outputs(child_cfg, rescaled) - reference).abs().max() <= 1e-5
    literal = soft_aggregate({0: parent, 1: child}, coefficients)[1]
    assert (outputs(child_cfg, literal) - reference).abs().max() > 1e-2


def test_fedtrans_rescales_cropped_columns_unless_told_not_to() -> None:
    logs = _LOGS[:2]
    for rescale, expected in (
        (True, {(0, 1): {"layers.c2.weight": 0.5}, (1, 0): {"layers.c2.weight": 2.0}}),
        (False, {}),
    ):
        algo = _bound(FedTransConfig(rescale_cropped=rescale), TrainConfig())
        state = ServerState(params={}, models=tuple(dataclasses.replace(_BASE, transforms=t) for t in logs))
        assert algo._input_scales(state, [0, 1]) == expected
        assert algo._input_scales(state, [1]) == {}


# ------------------------------------------------------------------------------------ one model = FedAvg
def test_fedtrans_with_one_model_is_fedavg_bit_for_bit() -> None:
    from rayfl.engine.driver import run_experiment
    from tests.integration.test_multi_model import split_test_dataset

    def run(algorithm: FedAvgConfig | FedTransConfig) -> Any:
        cfg = dataclasses.replace(tiny_config(kind="local"), model=CellNetConfig(channels=(4, 8)), algorithm=algorithm)
        return run_experiment(cfg, write=False, dataset=split_test_dataset())

    fedavg, fedtrans = run(FedAvgConfig()), run(FedTransConfig(max_models=1, force_rounds=(0, 1)))
    keys = ("train_loss", "test_acc", "test_loss", "client_acc", "train_macs", "bytes_down", "bytes_up", "num_models")
    assert [[getattr(r, k) for k in keys] for r in fedtrans.records] == [
        [getattr(r, k) for k in keys] for r in fedavg.records
    ]
    assert fedtrans.state.params.keys() == fedavg.state.params.keys()
    assert all(torch.equal(fedtrans.state.params[k], fedavg.state.params[k]) for k in fedavg.state.params)
