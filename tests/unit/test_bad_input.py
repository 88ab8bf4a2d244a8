"""Bad input a user can cause is refused with one line naming the file (and line or key) and what to do, before any
run directory exists; clock and report edge cases survive (issue 12, items 4 and 5)."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayfl.cli import main
from rayfl.config.sections import ResourceConfig, SystemConfig
from rayfl.core.errors import ConfigError
from rayfl.data.federated import from_client_arrays
from rayfl.engine.driver import run_experiment
from rayfl.engine.persist.records import make_run_dir
from rayfl.experiment.loader import load_config
from rayfl.report import REPORT_MD, report
from rayfl.system.resources import Log, TraceReplay
from tests.helpers import tiny_config, tiny_image_dataset

SYNTH = [
    "data.name=synthetic",
    "model.name=cnn",
    "model.channels=[4]",
    "data.num_clients=6",
    "clients_per_round=3",
    "train.sequence_loss=last",
]


def _trace(path: Path, kind: str, rows: str) -> Path:
    unit = {"memory": "MiB", "bandwidth_down": "Mbit/s", "bandwidth_up": "Mbit/s"}[kind]
    path.write_text(f"# rayfl-trace v1\n# kind: {kind}\n# unit: {unit}\nt_s,value\n{rows}", encoding="utf-8")
    return path


def _cli_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    """Run the CLI, expect exit code 2 and return its one stderr line (no traceback)."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rayfl: error: ") and "\n" not in err and "Traceback" not in err
    return err


# ------------------------------------------------------------------------------------------ config values
@settings(max_examples=30, deadline=None)
@given(
    key=st.sampled_from(["train.lr", "algorithm.server_lr", "algorithm.distill.lr", "train.momentum", "rounds"]),
    value=st.sampled_from([".inf", "-.inf", ".nan", "1e400"]),
)
def test_non_finite_numbers_are_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        method = "heterofl" if key.startswith("algorithm.distill") else "fedavg"
        load_config(None, [f"algorithm.name={method}", f"{key}={value}"])
    assert info.value.key_path == key
    assert "finite" in str(info.value) or "expected an integer" in str(info.value)


def test_zero_epochs_points_to_noop() -> None:
    with pytest.raises(ConfigError, match=r"train\.epochs: must be >= 1 .*train\.noop=true"):
        load_config(None, ["train.epochs=0"])


def test_clients_per_round_beyond_the_data_is_refused_before_and_after_loading(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"clients_per_round: 11 exceeds data.num_clients=10"):
        load_config(None, ["data.num_clients=10", "clients_per_round=11"])
    # a natural partition may keep fewer users than data.num_clients: checked after loading, before any directory
    cfg = dataclasses.replace(tiny_config(kind="local"), clients_per_round=20, output_dir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match=r"clients_per_round: 20 exceeds the 12 clients"):
        run_experiment(cfg, dataset=tiny_image_dataset())
    assert not (tmp_path / "runs").exists()


def test_model_that_cannot_read_the_data_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.name: model 'cnn' reads image inputs but data 'shakespeare'"):
        load_config(None, ["model.name=cnn"])
    # LEAF's task is known only after loading: a character data set given to the CNN fails before the run directory
    texts = [(np.zeros((4, 8), dtype=np.uint8), np.zeros(4, dtype=np.int64)) for _ in range(6)]
    text_ds = from_client_arrays("leaf", "tokens", 81, texts, texts[0][0], texts[0][1])
    cfg = dataclasses.replace(tiny_config(kind="local"), output_dir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match=r"model.name: model 'cnn' reads image inputs but data .* gives tokens"):
        run_experiment(cfg, dataset=text_ds)
    assert not (tmp_path / "runs").exists()


def test_a_pooling_grid_that_does_not_divide_the_maps_is_one_line_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """head_pool (and side_pool) depend on the data's resolution, so they are checked once the data is known: still a
    located one-line error before the run directory exists, not a traceback."""
    out = tmp_path / "runs"
    data = [a for a in SYNTH if not a.startswith("model.")]
    model = ["model.name=resnet", "model.widths=[4,8,8,8]", "model.head_pool=3"]
    err = _cli_error(capsys, ["run", f"output_dir={out}", *data, *model, "rounds=1", "backend.kind=local"])
    assert "override 'model.head_pool=3': model.head_pool: 3 must divide the 4x4 maps of the last stage" in err, err
    assert not out.exists()


def test_a_sequence_loss_on_images_is_refused_naming_the_default_file_and_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the embedded default (Shakespeare) trains on every position; overriding only data and model used to crash mid-run
    err = _cli_error(capsys, ["validate", "data.name=synthetic", "model.name=cnn"])
    assert "default.yaml:" in err and "train.sequence_loss: 'all' trains on every position" in err
    assert "set train.sequence_loss=last" in err
    load_config(None, ["data.name=synthetic", "model.name=cnn", "train.sequence_loss=last"])  # accepted


def test_a_named_smallest_model_the_network_cannot_hold_is_refused_by_validate_at_its_file_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``validate`` builds the model's family for the data's input (no weights, no data) and asks each method what it
    cannot serve: a named smallest model with more stages than the ResNet has is the key's file and line, as ``run``
    refuses it before round 0 (``bind_server``), and a phase's FedAvg the same under its own key."""
    path = tmp_path / "exp.yaml"
    path.write_text(
        "data: {name: synthetic, num_clients: 6}\n"
        "clients_per_round: 3\n"
        "train: {sequence_loss: last}\n"
        "model: {name: resnet, depth: 18, widths: [4, 8, 8, 8]}\n"
        "algorithm:\n"
        "  name: model_search\n"
        "  smallest:\n"
        "    blocks: [2, 2, 2, 2, 2]\n",
        encoding="utf-8",
    )
    err = _cli_error(capsys, ["validate", str(path)])
    assert f"{path}:8: algorithm.smallest.blocks: blocks needs one count per stage of the model (4)" in err, err
    err = _cli_error(capsys, ["validate", str(path), "algorithm.smallest.blocks=[2,2,2,3]"])
    assert "algorithm.smallest.blocks: blocks[3] = 3: stage 4 has 2 blocks" in err, err
    assert main(["validate", str(path), "algorithm.smallest.blocks=[1,1,1,1]"]) == 0
    err = _cli_error(
        capsys,
        ["validate", str(path), "rounds=1", "algorithm.smallest.blocks=[1,1,1,1]", "phases=[{rounds: 1, algorithm: "
         "{name: fedavg, model: smallest, ratios: [0, 1], smallest_blocks: [1]}}]"],
    )  # fmt: skip
    assert "phases[0].algorithm.smallest_blocks: blocks needs one count per stage of the model (4)" in err, err


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".hidden", "", "x\\y"])
def test_run_names_cannot_leave_output_dir(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=r"name: run name .* plain directory name"):
        load_config(None, [f"name={json.dumps(name)}"])
    with pytest.raises(ValueError, match="plain directory name"):
        make_run_dir(tmp_path / "runs", name)
    assert list(tmp_path.iterdir()) == []


def test_an_output_dir_that_is_a_file_or_cannot_be_made_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    both = ("validate", "run")
    cases = [
        (afile, "afile' is a file, not a directory:", both),
        (afile / "sub", "is a file, not a directory, so", both),
    ]
    if Path("/proc/self").is_dir():  # a directory nobody can make under /proc, root included: only mkdir tells root
        cases.append((Path("/proc/rayfl-runs"), "cannot (make a run directory in|write in) '/proc", ("run",)))
    for out, reason, commands in cases:
        for command in commands:
            err = _cli_error(capsys, [command, f"output_dir={out}", *SYNTH, "rounds=1", "backend.kind=local"])
            assert f"override 'output_dir={out}': output_dir: " in err, err
            assert re.search(reason, err), err
    config = tmp_path / "exp.yaml"
    config.write_text(f"rounds: 1\noutput_dir: {afile}\n")
    assert f"exp.yaml:2: output_dir: '{afile}' is a file" in _cli_error(capsys, ["run", str(config), *SYNTH])
    with pytest.raises(ConfigError, match=r"output_dir: .* is a file, not a directory"):
        run_experiment(dataclasses.replace(tiny_config(kind="local"), output_dir=str(afile / "sub")))
    with pytest.raises(ConfigError, match=r"output_dir: .* is a file, not a directory"):
        make_run_dir(afile, "x")
    assert sorted(tmp_path.iterdir()) == [afile, config] and afile.read_text() == "keep me\n"  # nothing written


# ------------------------------------------------------------------------------------------------- traces
def test_trace_problems_name_the_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n0,12\n1,oops\n", encoding="utf-8")
    err = _cli_error(capsys, ["validate", "system.memory.source=trace", f"system.memory.file={bad}"])
    assert "system.memory.file" in err and f"{bad}:6: bad number" in err

    wrong = _trace(tmp_path / "wrong.csv", "bandwidth_down", "0,5\n")
    err = _cli_error(capsys, ["validate", "system.memory.source=trace", f"system.memory.file={wrong}"])
    assert "system.memory.file" in err and "is a bandwidth_down trace, but it is configured as a memory" in err

    out = tmp_path / "runs"
    args = [
        "run",
        "system.memory.source=trace",
        f"system.memory.directory={tmp_path}",
        "system.memory.pattern='*.nomatch'",
        f"output_dir={out}",
        *SYNTH,
    ]
    err = _cli_error(capsys, args)
    assert "system.memory.pattern" in err and "no trace files matching '*.nomatch'" in err
    assert not out.exists()  # nothing written


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.text(alphabet="0123456789,.-e \n#:abkindut", max_size=60))
def test_any_trace_file_loads_or_gives_a_located_config_error(tmp_path: Path, body: str) -> None:
    path = tmp_path / "fuzz.csv"
    path.write_text("# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n" + body, encoding="utf-8")
    try:
        cfg = load_config(None, ["system.memory.source=trace", f"system.memory.file={path}"])
    except ConfigError as err:
        assert err.key_path == "system.memory.file" and str(path) in str(err)
    else:
        assert cfg.system.memory is not None and cfg.system.memory.file == str(path)


def test_an_all_zero_bandwidth_trace_fails_clients_with_no_network_not_a_crash(tmp_path: Path) -> None:
    zero = _trace(tmp_path / "zero.csv", "bandwidth_down", "0,0\n1,0\n2,0\n")
    system = SystemConfig(bandwidth_down=ResourceConfig(source="trace", file=str(zero)))
    cfg = dataclasses.replace(tiny_config(kind="local"), rounds=2, system=system, output_dir=str(tmp_path / "runs"))
    result = run_experiment(cfg, dataset=tiny_image_dataset())
    assert [r.clients_failed for r in result.records] == [5, 5]
    assert [r.failed_no_network for r in result.records] == [5, 5]  # a cause and a column of its own
    assert [(r.failed_other, r.failed_unavailable) for r in result.records] == [(0, 0), (0, 0)]
    assert result.run_dir is not None
    causes = (result.run_dir / "clients.csv").read_text().splitlines()[1:]
    assert len(causes) == 10 and all(",no_network," in row for row in causes)
    report = (result.run_dir / "report.md").read_text() if (result.run_dir / "report.md").exists() else ""
    assert not report or "no network" in report


def test_a_zero_bandwidth_span_delays_transfers_and_an_endless_start_never_ends() -> None:
    # 1 bit/s for 1 s, then 0 for 2 s: 2 bits starting at 0 finish in the next period's first second (t = 4)
    replay = TraceReplay([Log(np.array([0.0, 1.0, 2.0]), np.array([1.0, 0.0, 0.0]))], "round_robin", "zero", 0, "bw")
    clients = np.array([0, 0])
    times = replay.transfer_time(clients, np.array([0.0, np.inf]), np.array([2.0, 1.0]), 0)
    assert times[0] == pytest.approx(4.0) and times[1] == np.inf


# ------------------------------------------------------------------------------------------ backend, report
def test_unreachable_backend_address_fails_within_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # a local port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "runs"
    args = ["run", "backend.kind=ray", f"backend.address=127.0.0.1:{port}", "backend.start_timeout_s=1"]
    start = time.monotonic()
    err = _cli_error(capsys, [*args, f"output_dir={out}", *SYNTH])
    assert time.monotonic() - start < 30  # ray.init alone would retry for minutes
    assert f"backend.address: no Ray cluster answers at 127.0.0.1:{port} within 1 s" in err
    assert not out.exists()


def test_report_replaces_a_symlinked_report_md_and_never_writes_through_it(tmp_path: Path) -> None:
    cfg = dataclasses.replace(tiny_config(kind="local"), rounds=1, output_dir=str(tmp_path / "runs"))
    run_dir = run_experiment(cfg, dataset=tiny_image_dataset()).run_dir
    assert run_dir is not None
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (run_dir / REPORT_MD).symlink_to(victim)
    text, _ = report([run_dir])
    assert victim.read_text() == "keep me\n"
    assert not (run_dir / REPORT_MD).is_symlink() and (run_dir / REPORT_MD).read_text() == text
