"""Never silently non-finite (issue 12, item 3): a non-finite server step is rolled back and recorded, too many in a
row stop the run with a clear error, rounds where every client failed are flagged, NaN logits score NaN, not 0 %."""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path

import pytest
import torch

from rayfl.cli import main
from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Aggregate, ServerState
from rayfl.data.federated import FederatedDataset
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.guard import NonFiniteError, NonFiniteGuard
from rayfl.engine.progress import ProgressLine
from rayfl.fl.methods.fedavg.algorithm import FedAvg
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from tests.helpers import tiny_config, tiny_image_dataset, tiny_yaml
from tests.resume_cases import assert_records_agree, assert_same_state

TINY = tiny_yaml("nan", 4)


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return tiny_image_dataset()


def _yaml(tmp_path: Path) -> Path:
    path = tmp_path / "nan.yaml"
    path.write_text(TINY.format(out=tmp_path / "runs"))
    return path


def test_server_lr_1e300_is_rolled_back_and_stops_the_run_with_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 12's probe: the server step overflows; before, the model went NaN, accuracy read 0.0 % and the exit was 0
    assert main(["run", str(_yaml(tmp_path)), "algorithm.server_lr=1e300", "max_nonfinite_rounds=2"]) == 3
    err = capsys.readouterr().err
    assert "non-finite in 2 consecutive rounds (0-1)" in err and "algorithm.server_lr" in err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback
    summary = assert_records_agree(tmp_path / "runs" / "nan")
    assert summary["status"] == "stopped: non-finite model" and summary["rounds_rolled_back"] == 2
    assert summary["final_model_finite"] is True and 0.0 <= summary["final_test_acc"] <= 1.0


def test_a_client_learning_rate_beyond_float32_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # finite, so it passed validate, and torch's optimizer raised mid-run with a traceback and a half-written run
    assert main(["run", str(_yaml(tmp_path)), "train.lr=1e300"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"rayfl: error: {tmp_path / 'nan.yaml'}: override 'train.lr=1e300': train.lr: must be at most 3.403e+38 "
        "(float32's largest value), got 1e+300"
    ]
    assert not (tmp_path / "runs").exists()


def test_rolled_back_rounds_keep_the_previous_model_and_the_limit_stops_the_run(
    data: FederatedDataset, tmp_path: Path
) -> None:
    cfg = dataclasses.replace(
        tiny_config(kind="local"), rounds=2, output_dir=str(tmp_path), algorithm=FedAvgConfig(server_lr=1e300)
    )
    result = run_experiment(cfg, dataset=data)  # two rolled-back rounds: below max_nonfinite_rounds (3)
    assert [r.rolled_back for r in result.records] == [1, 1]
    assert_same_state(result.state.params, build_setup(cfg, data).params)  # still the initial model
    assert assert_records_agree(tmp_path / "tiny")["rounds_rolled_back"] == 2
    with pytest.raises(NonFiniteError, match="3 consecutive rounds"):
        run_experiment(dataclasses.replace(cfg, rounds=5, name="more"), dataset=data)
    summary = assert_records_agree(tmp_path / "more")
    assert summary["rounds"] == 3 and summary["status"] == "stopped: non-finite model"


def test_the_guard_passes_finite_states_and_rolls_back_others() -> None:
    before = ServerState(params={"w": torch.ones(3)})
    finite = ServerState(params={"w": torch.zeros(3)}, round_idx=1)
    nan = ServerState(params={"w": torch.tensor([0.0, math.nan, 0.0])}, round_idx=1)
    inf_momentum = ServerState(params={"w": torch.zeros(3)}, opt_state={"w": torch.full((3,), math.inf)})
    guard = NonFiniteGuard(limit=2)
    assert guard.check(0, before, nan) is before and guard.streak == 1
    assert guard.check(1, before, finite) is finite and guard.streak == 0  # a finite round resets the count
    assert guard.check(2, before, inf_momentum) is before  # optimizer state counts too
    assert guard.check(3, before, None) is before and guard.streak == 2  # None: the aggregate was not finite
    with pytest.raises(NonFiniteError, match="2 consecutive rounds"):
        guard.raise_if_exhausted(3)


class _NaNOnce(FedAvg):
    """FedAvg whose server step in round 1 returns NaN weights (a real algorithm plugged into the engine)."""

    def server_update(self, state: ServerState, round_idx: int, aggregate: Aggregate) -> ServerState:
        new = super().server_update(state, round_idx, aggregate)
        if round_idx != 1:
            return new
        return dataclasses.replace(new, params={k: torch.full_like(v, math.nan) for k, v in new.params.items()})


def test_one_bad_round_is_rolled_back_and_the_run_goes_on(
    data: FederatedDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayfl.fl.registry import METHODS

    monkeypatch.setitem(METHODS, "fedavg", dataclasses.replace(METHODS["fedavg"], algorithm=f"{__name__}:_NaNOnce"))
    result = run_experiment(dataclasses.replace(tiny_config(kind="local"), rounds=3), write=False, dataset=data)
    records = result.records
    assert [r.rolled_back for r in records] == [0, 1, 0]
    assert (records[1].test_acc, records[1].test_loss) == (records[0].test_acc, records[0].test_loss)  # same model
    assert records[2].test_loss != records[0].test_loss and result.model_finite


def test_rounds_where_every_client_failed_are_flagged(
    data: FederatedDataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # train.lr=.inf is refused by validate; a config built in Python still reaches a run: every update is NaN
    cfg = dataclasses.replace(
        tiny_config(kind="local"), rounds=2, output_dir=str(tmp_path), train=TrainConfig(lr=math.inf, batch_size=5)
    )
    stream = io.StringIO()
    result = run_experiment(cfg, dataset=data, callbacks=[ProgressLine(stream, cfg.rounds)])
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and all("ALL CLIENTS FAILED" in line for line in lines)
    assert all(r.clients_failed == r.clients_sampled == 5 and r.failed_other == 5 for r in result.records)
    assert assert_records_agree(tmp_path / "tiny")["rounds_all_failed"] == 2
    # from the command line (a finite learning rate big enough to make every update NaN): flagged, and warned
    assert main(["run", str(_yaml(tmp_path)), "train.lr=1e30", "rounds=2", "name=lr"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("ALL CLIENTS FAILED") == 2
    assert "every sampled client failed in 2 of 2 rounds" in captured.err


def test_nan_logits_score_nan_not_zero_percent(data: FederatedDataset) -> None:
    cfg = tiny_config(kind="local")
    setup = build_setup(cfg, data)
    backend = build_backend(cfg, setup)
    try:
        fine = backend.evaluate(setup.params)
        assert 0.0 <= fine.accuracy <= 1.0
        huge = {k: v * 1e30 if v.dim() > 1 else v for k, v in setup.params.items()}  # finite weights, inf logits
        assert all(bool(torch.isfinite(v).all()) for v in huge.values())
        broken = backend.evaluate(huge)
        assert math.isnan(broken.accuracy) and math.isnan(broken.loss) and broken.correct_mask is None
        nan = {k: torch.full_like(v, math.nan) for k, v in setup.params.items()}
        assert math.isnan(backend.evaluate(nan).accuracy)
    finally:
        backend.close()


def test_exit_code_is_3_when_the_final_model_scores_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a server step large but finite: the weights stay finite, the logits do not
    code = main(["run", str(_yaml(tmp_path)), "algorithm.server_lr=1e30", "rounds=1"])
    captured = capsys.readouterr()
    assert code == 3 and "not finite (or scores NaN)" in captured.err and "final test accuracy nan%" in captured.out
    summary = assert_records_agree(tmp_path / "runs" / "nan")
    assert summary["final_test_acc"] is None and summary["final_model_finite"] and summary["rounds_rolled_back"] == 0
