"""Shipped examples learn (issue 29, Build 5): every example under ``examples/`` run at reduced size ends far above
its most-frequent-label baseline: ``shapes_parquet.py`` (FedAvg on a Parquet table with natural writer clients, and
the numbers it prints are the run's), ``bert_tokens.yaml`` (a Hugging Face BERT on keyword token sequences) and
``resnet18_synthetic.yaml`` (torchvision's ResNet-18 on brighter-quadrant images), each run as shipped but for the
overrides named in its test."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.shapes_parquet import CLASSES, main, write_shapes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_shipped_example_config_is_tested_here() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == [
        "bert_tokens.yaml",
        "resnet18_synthetic.yaml",
        "shapes_parquet.yaml",
    ]


def _run_example(name: str, tmp_path: Path, overrides: list[str]) -> tuple[float, float, int]:
    """Run ``examples/NAME`` with ``overrides``: its final accuracy, baseline and test-set size."""
    import torch

    from rayfl.engine.driver import run_experiment
    from rayfl.experiment.loader import load_config

    cfg = load_config(EXAMPLES / name, [f"output_dir={tmp_path / 'runs'}", *overrides])
    result = run_experiment(cfg)
    assert result.final_eval is not None
    # the margins of issue 46 are read from here (pytest -rP): accuracy and baseline per kernel path
    print(
        f"{name}: accuracy {result.final_eval.accuracy:.4f}, baseline {result.baseline_acc:.4f}, kernels "
        f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} torch threads"
    )
    return result.final_eval.accuracy, result.baseline_acc, int(result.final_eval.num_samples)


def test_bert_tokens_learns_well_above_its_baseline(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    # 4 of the example's 6 rounds on half its clients' data
    acc, baseline, n = _run_example(
        "bert_tokens.yaml", tmp_path, ["rounds=4", "eval_every=4", "data.kwargs.per_client=64"]
    )
    assert n == 512 and baseline < 0.3  # four balanced keyword classes
    assert acc >= baseline + 0.3, (acc, baseline)


def test_resnet18_synthetic_learns_well_above_its_baseline(tmp_path: Path) -> None:
    """12 rounds on half the example's images. Where the run takes off depends on the CPU's kernels (issue 46): the
    same seeded run at 4 rounds ended at 0.69 with this machine's AVX2 kernels, 0.31 with ``ATEN_CPU_CAPABILITY=
    default``, 0.39 with oneDNN held to SSE4.1 and 0.43 on an AVX-512 machine, against a baseline of 0.24; the take-off
    came between rounds 4 and 8 on every path, and from round 10 on every path measured was at 0.96-1.00 (own AVX2,
    ATen default, oneDNN SSE4.1, both together, one thread: ``python benchmarks/kernel_paths.py rounds=12
    data.kwargs.num_samples=512``, ``benchmarks/results/kernel_paths.md``). So the run is long enough for the
    plateau, not the take-off."""
    acc, baseline, n = _run_example(
        "resnet18_synthetic.yaml", tmp_path, ["rounds=12", "eval_every=12", "data.kwargs.num_samples=512"]
    )
    assert n == 256 and baseline < 0.3  # four balanced quadrant classes
    assert acc >= baseline + 0.5, (acc, baseline)


def test_shapes_parquet_learns_well_above_its_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    figures = main(["--data", str(tmp_path / "shapes"), f"output_dir={tmp_path / 'runs'}", "rounds=8"])
    out = capsys.readouterr().out
    print(f"shapes_parquet: {figures}")  # the margins of issue 46 (pytest -rP)
    assert f"wrote the shapes data to {tmp_path / 'shapes'}" in out
    assert figures["chance"] == 1 / len(CLASSES) and figures["baseline"] < 0.15
    # 8 of the example's 30 rounds: about 62 % (the full run: about 90 %), against a baseline of about 11 %
    assert figures["accuracy"] >= figures["baseline"] + 0.35, figures
    assert f"test accuracy {figures['accuracy']:.1%} after 8 rounds" in out


def test_the_shapes_table_is_natural_non_iid_and_reproducible(tmp_path: Path) -> None:
    import numpy as np
    import pyarrow.parquet as pq

    a, b = write_shapes(tmp_path / "a"), write_shapes(tmp_path / "b")
    ta, tb = pq.read_table(a / "train"), pq.read_table(b / "train")
    assert ta.equals(tb) and ta.num_rows == 60 * 80 and ta.schema.names == ["pixels", "label", "writer"]
    labels, writers = ta.column("label").to_numpy(), np.array(ta.column("writer").to_pylist())
    shares = [np.bincount(labels[writers == w], minlength=10).max() / 80 for w in np.unique(writers)]
    assert np.median(shares) > 0.25  # each writer draws a few shapes far more often than the others
