"""Paper 000's report layouts: methods and settings read off run directories, Table 3, utilisation, curves.

The run directories are real: written file by file like the engine does, and in the last test by the engine itself.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, ResourceConfig, SystemConfig, TrainConfig
from rayfl.engine.driver import run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.fl.methods.model_search.config import ModelSearchConfig
from rayfl.report import REPORT_MD, UTILISATION_PNG, load_run, report
from rayfl.report.paper import method_label, paper_grid, setting_of, table3_markdown, utilisation_markdown
from tests.helpers import tiny_image_dataset

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NAN = math.nan


def write_run(
    run_dir: Path,
    algorithm: dict[str, Any],
    test_acc: list[float],
    *,
    setting: str | None = None,
    sim_step_s: float = 600.0,
    memory_util: float = 0.5,
    bandwidth_util: float = 0.25,
) -> Path:
    """A run directory as the engine leaves it: rounds.parquet and the resolved config.yaml."""
    run_dir.mkdir(parents=True)
    n = len(test_acc)
    pd.DataFrame(
        {
            "round_idx": range(n),
            "sim_time_s": [sim_step_s * (i + 1) for i in range(n)],
            "test_acc": test_acc,
            "memory_util": [memory_util] * n,
            "bandwidth_util": [bandwidth_util] * n,
        }
    ).to_parquet(run_dir / "rounds.parquet", index=False)
    config: dict[str, Any] = {"name": run_dir.name, "algorithm": algorithm}
    if setting is not None:
        config["setting"] = setting
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return run_dir


def rows_of(markdown: str, title: str) -> dict[str, list[str]]:
    """The block whose header cell is ``title``: method -> cells."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {title} |"))
    out = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0]] = cells[1:]
    return out


def header_of(markdown: str, title: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {title} |"))
    return [c.strip() for c in line.strip("|").split("|")][1:]


def assert_png(path: Path) -> None:
    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_MAGIC


ON = {"enabled": True}
OFF = {"enabled": False}


@pytest.mark.parametrize(
    ("config", "label"),
    [
        ({"algorithm": {"name": "fedavg", "model": "full", "budgets": "ignore"}}, "Largest"),
        ({"algorithm": {"name": "fedavg", "model": "full", "budgets": "enforce"}}, "FedAvg"),
        ({"algorithm": {"name": "fedavg", "model": "smallest", "budgets": "enforce"}}, "Smallest"),
        ({"algorithm": {"name": "heterofl", "distill": OFF}}, "HeteroFL"),
        ({"algorithm": {"name": "heterofl", "distill": ON}}, "HeteroFL (w/)"),
        ({"algorithm": {"name": "model_search", "distill": ON}}, "Model search (w/)"),
        ({"algorithm": {"name": "model_search", "distill": OFF}}, "Model search (w/o)"),
        ({"algorithm": {"name": "fjord", "distill": OFF}}, "FjORD"),
        ({"algorithm": {"name": "anycostfl"}}, "AnyCostFL"),
        ({"algorithm": {"name": "newmethod"}}, "newmethod"),
        ({"algorithm": {"name": "fedavg"}, "compression": {"kind": "qsgd"}}, "FedAvg + QSGD"),
        ({}, "unknown"),
    ],
)
def test_method_label_follows_table_3(config: dict[str, Any], label: str) -> None:
    assert method_label(config) == label


def test_setting_comes_from_the_config_else_the_parent_folder(tmp_path: Path) -> None:
    labelled = load_run(write_run(tmp_path / "anywhere" / "a", {"name": "heterofl"}, [0.5], setting="setting3"))
    unlabelled = load_run(write_run(tmp_path / "setting4" / "b", {"name": "heterofl"}, [0.5]))
    assert setting_of(labelled) == "setting3"
    assert setting_of(unlabelled) == "setting4"


@pytest.fixture
def grid_runs(tmp_path: Path) -> list[Path]:
    """Four methods over two settings (folders setting2 and setting10); Largest misses setting10."""
    search = {"name": "model_search", "distill": ON}
    return [
        write_run(tmp_path / "setting10" / "ms", search, [0.2, NAN, 0.61], sim_step_s=1200.0, memory_util=0.9),
        write_run(tmp_path / "setting2" / "ms", search, [0.3, 0.55], sim_step_s=3600.0),
        write_run(tmp_path / "setting2" / "small", {"name": "fedavg", "model": "smallest"}, [0.1, 0.4]),
        write_run(tmp_path / "setting10" / "small", {"name": "fedavg", "model": "smallest"}, [0.45]),
        write_run(tmp_path / "setting2" / "largest", {"name": "fedavg", "budgets": "ignore"}, [0.7, 0.8]),
        write_run(tmp_path / "setting2" / "hfl", {"name": "heterofl", "distill": OFF}, [0.5, 0.5]),
        write_run(tmp_path / "setting10" / "hfl", {"name": "heterofl", "distill": OFF}, [0.5], bandwidth_util=NAN),
    ]


def test_table3_rows_are_methods_in_paper_order_and_columns_are_settings(grid_runs: list[Path]) -> None:
    grid = paper_grid([load_run(d) for d in grid_runs])
    assert grid.settings == ("setting2", "setting10")  # natural order, not "setting10" < "setting2"
    assert grid.methods == ("Largest", "Smallest", "HeteroFL", "Model search (w/)")
    text = table3_markdown(grid)
    assert header_of(text, "Accuracy (%)") == ["setting2", "setting10"]
    acc = rows_of(text, "Accuracy (%)")
    assert acc["Model search (w/)"] == ["55.00", "61.00"]  # the last evaluated round, not the best
    assert acc["Largest"] == ["80.00", "—"]
    latency = rows_of(text, "Latency (sim. hours)")
    assert latency["Model search (w/)"] == ["2.00", "1.00"]  # 2 rounds x 3600 s; 3 rounds x 1200 s
    assert latency["Smallest"] == ["0.333", "0.167"]  # below an hour: three significant digits


def test_utilisation_table_means_the_per_round_values(grid_runs: list[Path]) -> None:
    text = utilisation_markdown(paper_grid([load_run(d) for d in grid_runs]))
    assert rows_of(text, "Memory utilisation (%)")["Model search (w/)"] == ["50.00", "90.00"]
    assert rows_of(text, "Bandwidth utilisation (%)")["HeteroFL"] == ["25.00", "—"]  # no finite value: unknown


def test_a_repeated_method_keeps_the_later_run_and_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = write_run(tmp_path / "s" / "one", {"name": "heterofl"}, [0.3])
    second = write_run(tmp_path / "s" / "two", {"name": "heterofl"}, [0.4])
    with caplog.at_level(logging.WARNING):
        grid = paper_grid([load_run(first), load_run(second)])
    assert grid.cells[("HeteroFL", "s")].path == second
    assert any("both HeteroFL in s" in r.getMessage() for r in caplog.records)


def test_report_of_several_settings_adds_the_paper_layouts(grid_runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "report"
    markdown, pngs = report(grid_runs, out_dir=out)
    names = [p.name for p in pngs]
    assert UTILISATION_PNG in names
    for setting in ("setting2", "setting10"):
        assert f"accuracy_vs_rounds_{setting}.png" in names
        assert f"accuracy_vs_sim_hours_{setting}.png" in names
    for png in pngs:
        assert_png(png)
        assert f"({png.name})" in markdown
    assert "## Paper 000, Table 3" in markdown
    assert rows_of(markdown, "Accuracy (%)")["HeteroFL"] == ["50.00", "50.00"]
    assert (out / REPORT_MD).read_text(encoding="utf-8") == markdown


def test_one_setting_gets_the_paper_layouts_only_when_asked(tmp_path: Path) -> None:
    runs = [
        write_run(tmp_path / "setting1" / "a", {"name": "heterofl"}, [0.3, 0.4]),
        write_run(tmp_path / "setting1" / "b", {"name": "fedrolex"}, [0.2, 0.35]),
    ]
    plain, plain_pngs = report(runs, out_dir=tmp_path / "plain")
    assert "Table 3" not in plain and UTILISATION_PNG not in [p.name for p in plain_pngs]
    paper, paper_pngs = report(runs, out_dir=tmp_path / "paper", paper=True)
    assert rows_of(paper, "Accuracy (%)") == {"HeteroFL": ["40.00"], "FedRolex": ["35.00"]}
    assert UTILISATION_PNG in [p.name for p in paper_pngs]


def test_engine_runs_are_grouped_by_their_setting_label(tmp_path: Path) -> None:
    """Two real two-round runs written by the engine: the `setting` of the config reaches the report."""
    dataset = tiny_image_dataset(num_clients=6, per_client=8)
    system = SystemConfig(
        memory=ResourceConfig(source="uniform", low=0.1, high=2.0),
        bandwidth_down=ResourceConfig(source="constant", low=1.0),
        comm_limit_s=5.0,
    )
    base = ExperimentConfig(
        rounds=2,
        clients_per_round=3,
        output_dir=str(tmp_path / "runs"),
        model=CNNConfig(channels=(4, 8)),
        train=TrainConfig(lr=0.05, batch_size=4, eval_batch_size=16),
        backend=BackendConfig(kind="local", num_hosts=1),
        system=system,
    )
    search = ModelSearchConfig(distill=DistillConfig(enabled=True, subnets=2, iterations=1, batch_size=4))
    dirs = []
    for setting, algorithm in (("alpha", HeteroFLConfig()), ("beta", search)):
        cfg = dataclasses.replace(base, name=f"{setting}-run", setting=setting, algorithm=algorithm)
        result = run_experiment(cfg, dataset=dataset)
        assert result.run_dir is not None
        dirs.append(result.run_dir)
    markdown, _ = report(dirs, out_dir=tmp_path / "report")
    assert header_of(markdown, "Accuracy (%)") == ["alpha", "beta"]
    acc = rows_of(markdown, "Accuracy (%)")
    assert acc["HeteroFL"][1] == "—" and acc["Model search (w/)"][0] == "—"
    assert acc["HeteroFL"][0] == f"{100.0 * load_run(dirs[0]).final_test_acc:.2f}"
    memory = rows_of(markdown, "Memory utilisation (%)")
    assert 0.0 < float(memory["HeteroFL"][0]) <= 100.0
