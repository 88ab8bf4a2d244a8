"""FedTrans (paper 002) with hand-computed values: DoC (Eq. 1), similarity of a three-model family, one utility update
(Eq. 4), one soft aggregation with cropping and decay (Eq. 5), Eq. 3's sampling frequencies, and the transformation
rule (cells above alpha x max; widen, then deepen the cell next time)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rayfl.algorithms.fedtrans import FedTrans, FedTransState
from rayfl.algorithms.fedtrans_math import (
    degree_of_convergence,
    family_similarity,
    model_similarity,
    sample_model,
    select_cells,
    soft_aggregate,
    softmax,
    update_utilities,
)
from rayfl.config import CellNetConfig, FedTransConfig, TrainConfig
from rayfl.models.cellnet import build_graph
from rayfl.rng import derive_rng


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
    from rayfl.algorithms.base import ServerContext
    from rayfl.models import InputSpec
    from tests.helpers import tiny_image_dataset

    cfg = CellNetConfig(channels=(4, 8), norm="none")
    spec = InputSpec("image", 4, (3, 8, 8))
    algo = FedTrans(FedTransConfig(alpha=0.5, noise=0.0), TrainConfig())
    algo.bind_server(ServerContext(0, 3, 2, spec, None, None, tiny_image_dataset(num_clients=3), model=cfg))
    from rayfl.engine.client_state import initial_weights

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
