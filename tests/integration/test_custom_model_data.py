"""Users' own model and data by import path (``model.name: custom``, ``data.name: custom``): the examples under
``examples/`` train end to end on both backends with identical results, the README's command works from the
repository root with the console script, a package in the working directory resolves on the driver and on Ray's
hosts, and a wrong factory is one clear error (a ``ConfigError``; from the command line one line, exit 2, nothing
written, and ``rayfl validate`` finds it)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from rayfl.cli import main
from rayfl.config.model import CustomModelConfig
from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
from rayfl.core.errors import ConfigError
from rayfl.data import build_federated_dataset
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.models import InputSpec, build_model

REPO = Path(__file__).resolve().parents[2]


def _example(name: str, *overrides: str) -> ExperimentConfig:
    return load_config(REPO / "examples" / name, list(overrides))


def _assert_identical(a: RunResult, b: RunResult) -> None:
    keys = ("train_loss", "test_acc", "test_loss", "clients_run", "bytes_down", "bytes_up")
    assert [tuple(getattr(r, k) for k in keys) for r in a.records] == [
        tuple(getattr(r, k) for k in keys) for r in b.records
    ]
    for name in a.state.params:
        assert torch.equal(a.state.params[name], b.state.params[name]), name


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_custom_bert_and_data_train_the_same_on_both_backends() -> None:
    pytest.importorskip("transformers")
    small = ("rounds=2", "data.kwargs.per_client=16", "train.epochs=1")
    local = run_experiment(_example("bert_tokens.yaml", *small), write=False)
    cfg = _example("bert_tokens.yaml", *small, "backend.kind=ray", "backend.num_hosts=2", "backend.cpus_per_host=0.25")
    remote = run_experiment(cfg, write=False)
    assert len(local.records) == 2 and all(r.clients_run == 4 for r in local.records)
    assert np.isfinite(local.records[-1].train_loss)
    _assert_identical(local, remote)


def test_torchvision_resnet18_on_custom_arrays_trains() -> None:
    cfg = _example("resnet18_synthetic.yaml", "rounds=1", "clients_per_round=2")
    result = run_experiment(cfg, write=False)
    record = result.records[-1]
    assert record.clients_run == 2 and np.isfinite(record.train_loss)
    assert "fc.weight" in result.state.params and result.state.params["fc.weight"].shape == (4, 512)


def _spec() -> InputSpec:
    return InputSpec(input_kind="image", num_classes=4, sample_shape=(3, 32, 32))


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        ("no_such_pkg.models:net", {}, r"model.factory: 'no_such_pkg.models:net': cannot import module 'no_such_pkg"),
        ("examples.resnet_synthetic", {}, r"expected an import path 'package.module:function'"),
        ("examples.resnet_synthetic:resnet99", {}, r"has no attribute 'resnet99'"),
        ("examples.resnet_synthetic:__doc__", {}, r"'__doc__' is a str, not a callable"),
        ("collections:OrderedDict", {}, r"returned a collections.OrderedDict, expected a torch.nn.Module"),
        (
            "examples.resnet_synthetic:resnet18",
            {"num_classes": 3},
            r"forward returned .* \(2, 3\), expected .*\(2, 4\)",
        ),
        (
            "examples.resnet_synthetic:resnet18",
            {"depth": 3},
            r"calling 'examples.resnet_synthetic:resnet18' with \['depth', 'num_classes'\]",
        ),
    ],
)
def test_a_bad_model_factory_is_one_clear_error(factory: str, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_model(CustomModelConfig(factory=factory, kwargs=kwargs), _spec())


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        ("examples.resnet_synthetic:nothing", {}, r"data.factory: .*has no attribute 'nothing'"),
        (
            "examples.resnet_synthetic:images",
            {"num_samples": -1000},
            r"data.factory: 'examples.resnet_synthetic:images' raised ValueError: negative dim",
        ),
        ("examples.resnet_synthetic:resnet18", {"num_classes": 2}, r"returned a torchvision.*ResNet, expected a rayfl"),
        ("tests.integration.test_custom_model_data:_labels_out_of_range", {}, r"y has labels in \[0, 7\], outside"),
        ("tests.integration.test_custom_model_data:_flat_images", {}, r"x must be \[N, T\]|must be an integer dtype"),
    ],
)
def test_a_bad_data_factory_is_one_clear_error(factory: str, kwargs: dict[str, object], message: str) -> None:
    cfg = DataConfig(name="custom", factory=factory, kwargs=kwargs, partition="iid", num_clients=2)
    with pytest.raises(ConfigError, match=message):
        build_federated_dataset(cfg, seed=0)


def _labels_out_of_range() -> dict[str, np.ndarray]:
    x = np.zeros((8, 3, 4, 4), dtype=np.uint8)
    return {"x": x, "y": np.arange(8), "x_test": x[:2], "y_test": np.zeros(2, dtype=np.int64), "num_classes": 4}


def _flat_images() -> dict[str, np.ndarray]:
    x = np.zeros((8, 5), dtype=np.float32)
    return {"x": x, "y": np.zeros(8, dtype=np.int64), "x_test": x[:2], "y_test": np.zeros(2, dtype=np.int64)}


def test_a_sub_model_method_refuses_a_custom_model_and_points_to_the_recipe() -> None:
    cfg = dataclasses.replace(_example("resnet18_synthetic.yaml"), algorithm=HeteroFLConfig())
    with pytest.raises(ValueError, match=r"ElasticFamily \(docs/models.md: 'Your own model with sub-model methods'\)"):
        run_experiment(cfg, write=False)


def _console_script(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """``rayfl`` as its console script runs: from a file outside the working directory (so ``sys.path[0]`` is that
    file's folder, not the working directory), with only the package ``rayfl`` importable (as an installed rayfl is;
    this checkout's, through a folder that holds nothing else)."""
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    site.mkdir()
    (site / "rayfl").symlink_to(REPO / "rayfl", target_is_directory=True)
    script = bin_dir / "rayfl"
    script.write_text("import sys\nfrom rayfl.cli import main\nsys.exit(main())\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return [sys.executable, str(script)], {**env, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}


def test_the_readme_example_runs_from_the_repository_root_with_the_console_script(tmp_path: Path) -> None:
    command, env = _console_script(tmp_path)
    out = tmp_path / "runs"
    args = ["run", "examples/resnet18_synthetic.yaml", "rounds=1", "clients_per_round=2", f"output_dir={out}"]
    done = subprocess.run([*command, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rounds = (out / "resnet18_synthetic" / "rounds.csv").read_text().splitlines()
    assert len(rounds) == 2  # the header and round 0
    assert f"results: {out / 'resnet18_synthetic'}" in done.stdout


_FACTORIES = """
    import numpy as np
    from torch import nn


    def net(num_classes, input_shape):
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


    def blobs(seed):
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(48, 1, 4, 4)).astype(np.float32)
        y = (x.reshape(48, -1).mean(axis=1) > 0).astype(np.int64)
        return {"x": x[:40], "y": y[:40], "x_test": x[40:], "y_test": y[40:]}
"""


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_a_package_in_the_working_directory_resolves_on_the_driver_and_on_ray_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray was started from the repository root (this session's instance), the run from another folder holding the
    package: the driver imports it from its working directory, and the hosts from the driver's, which the run ships
    to them."""
    package = "rayfl_cwd_factories"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text(textwrap.dedent(_FACTORIES))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, package, raising=False)
    cfg = ExperimentConfig(
        rounds=2,
        clients_per_round=3,
        data=DataConfig(name="custom", factory=f"{package}:blobs", partition="iid", num_clients=4),
        model=CustomModelConfig(factory=f"{package}:net"),
        train=TrainConfig(batch_size=5, eval_batch_size=8, sequence_loss="last"),
        backend=BackendConfig(kind="ray", num_hosts=2, cpus_per_host=0.25),
    )
    try:
        remote = run_experiment(cfg, write=False)
        local = run_experiment(dataclasses.replace(cfg, backend=BackendConfig(kind="local", num_hosts=2)), write=False)
    finally:
        sys.modules.pop(package, None)
    assert all(r.clients_run == 3 for r in remote.records)
    _assert_identical(local, remote)


def test_a_bad_factory_from_the_command_line_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(REPO / "examples" / "resnet18_synthetic.yaml")
    out = tmp_path / "runs"
    assert main(["validate", config]) == 0  # the example's factories resolve and its model builds (meta device)
    cases = [
        ("model.factory=collections:OrderedDict", "model.factory: 'collections:OrderedDict' returned a collections"),
        ("model.factory=no_such_pkg:net", "model.factory: 'no_such_pkg:net': cannot import module 'no_such_pkg'"),
        ("data.factory=examples.resnet_synthetic:nope", "data.factory: 'examples.resnet_synthetic:nope': module"),
    ]
    for override, message in cases:
        for command in ("validate", "run"):
            code = main([command, config, override, f"output_dir={out}", "rounds=1"])
            err = capsys.readouterr().err.strip()
            assert code == 2, (command, override, err)
            assert err.startswith(f"rayfl: error: {config}: override '{override}': {message}"), err
            assert "\n" not in err and "Traceback" not in err
    # the factory itself fails (validate loads no data, so only the run finds it): located at data.factory's line
    assert main(["run", config, "data.kwargs={num_samples: -1000}", f"output_dir={out}", "rounds=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"rayfl: error: {config}:15: data.factory: 'examples.resnet_synthetic:images' raised ValueError: negative"
    ), err
    assert not out.exists()
