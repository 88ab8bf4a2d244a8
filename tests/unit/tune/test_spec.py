"""Sweep files: every mistake is reported with its field, file and line before Tune starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfl.core.errors import ConfigError
from rayfl.tune import load_sweep
from rayfl.tune.space import grid_points

REPO = Path(__file__).resolve().parents[3]

BASE = """\
name: tiny
rounds: 2
clients_per_round: 4
data: {name: synthetic, partition: iid, num_clients: 8, synthetic_samples: 16}
model: {name: cnn, channels: [4, 8]}
algorithm: {name: model_search, ratios: [0, 0.5, 1], epsilon: 0.8}
backend: {kind: ray, num_hosts: 2}
"""

SWEEP = """\
# rayfl sweep {path}
base: base.yaml
overrides:
  - rounds=3
param_space:
  algorithm.epsilon: [0.2, 0.6, 1.0]
  algorithm.t_max: [1, 5]
max_concurrent_trials: 2
"""


def write(tmp_path: Path, sweep: str, name: str = "sweep.yaml") -> Path:
    (tmp_path / "base.yaml").write_text(BASE)
    path = tmp_path / name
    path.write_text(sweep.replace("{path}", str(path)))
    return path


def error(tmp_path: Path, sweep: str, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_sweep(write(tmp_path, sweep), overrides)
    return info.value


def test_a_valid_sweep_expands_its_grid_and_resolves_each_trial(tmp_path: Path) -> None:
    sweep = load_sweep(write(tmp_path, SWEEP))
    assert sweep.name == "sweep" and sweep.config.mode == "train" and sweep.config.metric == "test_acc"
    points = grid_points(sweep.params)
    assert len(points) == 6 and points[0] == {"algorithm.epsilon": 0.2, "algorithm.t_max": 1}
    assert points[1] == {"algorithm.epsilon": 0.2, "algorithm.t_max": 5}  # the last key varies fastest
    assert len(sweep.checked) == 6
    cfg = sweep.plan.config({"algorithm.epsilon": 0.6, "algorithm.t_max": 5}, name="t1")
    assert (cfg.rounds, cfg.algorithm.epsilon, cfg.algorithm.t_max, cfg.name) == (3, 0.6, 5, "t1")  # type: ignore[union-attr]
    assert cfg.output_dir == str(sweep.plan.trials_dir)
    assert cfg.backend.cpus_per_host == 0.25  # "split the cluster" became an explicit share


def test_unknown_sweep_field_names_field_file_and_line(tmp_path: Path) -> None:
    err = error(tmp_path, SWEEP + "max_concurent_trials: 3\n")
    assert (Path(str(err.file)).name, err.line) == ("sweep.yaml", 9)
    assert "max_concurent_trials" in str(err) and "did you mean 'max_concurrent_trials'" in str(err)


def test_mistyped_swept_key_fails_before_tune_at_its_line(tmp_path: Path) -> None:
    err = error(tmp_path, SWEEP.replace("algorithm.t_max:", "algorithm.tmax:"))
    assert (Path(str(err.file)).name, err.line, err.key_path) == ("sweep.yaml", 7, "param_space.algorithm.tmax")
    assert "unknown key 'tmax'" in str(err) and "did you mean 't_max'" in str(err)


def test_out_of_range_value_and_bad_override_point_at_their_lines(tmp_path: Path) -> None:
    err = error(tmp_path, SWEEP.replace("[0.2, 0.6, 1.0]", "[0.2, 1.5]"))
    assert err.line == 6 and "param_space.algorithm.epsilon: must be >= 0 and <= 1, got 1.5" in str(err)
    err = error(tmp_path, SWEEP.replace("rounds=3", "roundz=3"))
    assert err.line == 4 and "unknown key 'roundz'" in str(err)


@pytest.mark.parametrize(
    ("entry", "line", "message"),
    [
        ("{uniform: [0.9, 0.1]}", 6, "low < high"),
        ("{loguniform: [0, 1]}", 6, "0 < low"),
        ("{randint: [1, 2.5]}", 6, "two integers"),
        ("{gaussian: [0, 1]}", 6, "unknown distribution 'gaussian'"),
        ("{uniform: [0.1, 0.9], choice: [1]}", 6, "expected a list (grid) or one of"),
        ("0.5", 6, "expected a list (grid) or one of"),
        ("[]", 6, "at least one value"),
        ("[0.2, 0.2]", 6, "listed twice"),
        ("{choice: 0.3}", 6, "takes a list"),
    ],
)
def test_bad_distributions_are_refused_at_their_line(tmp_path: Path, entry: str, line: int, message: str) -> None:
    sweep = SWEEP.replace("[0.2, 0.6, 1.0]", entry) + "search: random\n"
    err = error(tmp_path, sweep)
    assert err.line == line and message in str(err) and Path(str(err.file)).name == "sweep.yaml"


def test_drawn_values_need_random_search_and_their_range_is_checked(tmp_path: Path) -> None:
    err = error(tmp_path, SWEEP.replace("[0.2, 0.6, 1.0]", "{uniform: [0.1, 0.9]}"))
    assert err.line == 6 and "search: random" in str(err)
    err = error(tmp_path, SWEEP.replace("[0.2, 0.6, 1.0]", "{uniform: [0.1, 1.9]}") + "search: random\n")
    assert err.line == 6 and "must be >= 0 and <= 1, got 1.9" in str(err)  # a range's ends are loaded as trials
    ok = load_sweep(write(tmp_path, SWEEP.replace("[0.2, 0.6, 1.0]", "{uniform: [0.1, 0.9]}") + "search: random\n"))
    assert [p.kind for p in ok.params] == ["uniform", "grid"]


def test_switching_the_algorithm_retypes_its_section(tmp_path: Path) -> None:
    sweep = "# rayfl sweep {path}\nbase: base.yaml\nparam_space:\n  algorithm.name: [heterofl, model_search]\n"
    loaded = load_sweep(write(tmp_path, sweep + "  seed: [0, 1]\n"))
    names = [c.algorithm.name for c in loaded.checked]
    assert names == ["heterofl", "heterofl", "model_search", "model_search"]
    assert loaded.checked[2].algorithm.epsilon == 0.8  # type: ignore[union-attr]  # the base's own keys stay
    # a key of the other variant cannot be swept together with it, and the error says whose key it is
    err = error(tmp_path, sweep + "  algorithm.t_max: [1, 5]\n")
    assert err.line == 5 and "'t_max' belongs to 'model_search'" in str(err) and "heterofl" in str(err)


def test_keys_the_sweep_owns_or_sets_twice_are_refused(tmp_path: Path) -> None:
    err = error(tmp_path, SWEEP.replace("param_space:\n", "param_space:\n  output_dir: [a, b]\n"))
    assert err.line == 6 and "cannot be swept" in str(err)
    err = error(tmp_path, SWEEP.replace("  - rounds=3", "  - name=x"))
    assert err.line == 4 and "set by the sweep" in str(err)
    err = error(tmp_path, SWEEP.replace("  - rounds=3", "  - algorithm.t_max=3"))
    assert err.line == 7 and "both swept and set in overrides (line 4)" in str(err)


def test_metrics_plot_keys_and_base_file_are_checked(tmp_path: Path) -> None:
    assert "unknown metric 'acc'" in str(error(tmp_path, SWEEP + "metric: acc\n"))
    err = error(tmp_path, SWEEP + "scheduler: {kind: asha, metric: accuracy}\n")
    assert err.line == 9 and "trials report" in str(err)
    err = error(tmp_path, SWEEP + "plot: {x: algorithm.eps}\n")
    assert err.line == 9 and "not a swept key" in str(err)
    err = error(tmp_path, SWEEP.replace("base: base.yaml", "base: missing.yaml"))
    assert err.line == 2 and "does not exist" in str(err)
    assert "base: required" in str(error(tmp_path, SWEEP.replace("base: base.yaml\n", "")))


def test_inline_base_errors_point_into_the_sweep_file(tmp_path: Path) -> None:
    inline = "base:\n" + "".join(f"  {line}\n" for line in BASE.replace("per_round: 4", "per_round: -4").splitlines())
    err = error(tmp_path, SWEEP.replace("base: base.yaml\n", inline))
    assert Path(str(err.file)).name == "sweep.yaml" and err.line == 5 and "clients_per_round: must be >= 1" in str(err)


def test_command_line_overrides_set_sweep_fields_swept_keys_and_the_base(tmp_path: Path) -> None:
    sweep = load_sweep(
        write(tmp_path, SWEEP), ["num_samples=2", "param_space.algorithm.t_max=[3]", "base.clients_per_round=2"]
    )
    assert sweep.config.num_samples == 2
    assert [p.values for p in sweep.params] == [(0.2, 0.6, 1.0), (3,)]
    assert all(c.clients_per_round == 2 and c.rounds == 3 for c in sweep.checked)
    with pytest.raises(ConfigError, match=r"override 'base\.clients_per_round=0'"):
        load_sweep(write(tmp_path, SWEEP), ["base.clients_per_round=0"])


@pytest.mark.parametrize("path", sorted((REPO / "experiments" / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_sweep_validates_and_opens_with_its_command(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first == f"# rayfl sweep experiments/sweeps/{path.name}"
    try:
        sweep = load_sweep(path)
    except ConfigError as err:  # a trace set that is fetched, not shipped (a fresh clone has not fetched it)
        if "is not on this machine: fetch it once with: rayfl traces fetch" not in str(err):
            raise
        pytest.skip(f"{path.name} reads a trace set this machine has not fetched: {err}")
    assert sweep.checked


def test_a_trial_decides_auto_as_the_one_process_it_runs_in_process_on(tmp_path: Path) -> None:
    """A sweep trial forks no worker processes (``tune/resources.py``), so ``backend.kind: auto`` takes the
    cross-over measured against one process: a large trial goes to Ray, a small one stays in its driver."""
    for rounds, kind in ((300, "ray"), (3, "local")):  # 300 x 4 = 1,200 client-epochs, over the 1,000 cross-over
        (tmp_path / "base.yaml").write_text(BASE.replace("kind: ray", "kind: auto, processes: auto"))
        path = tmp_path / "sweep.yaml"
        path.write_text(SWEEP.replace("{path}", str(path)).replace("rounds=3", f"rounds={rounds}"))
        cfg = load_sweep(path).plan.config({"algorithm.epsilon": 0.6, "algorithm.t_max": 5}, name="t1")
        assert (cfg.backend.kind, cfg.backend.processes) == (kind, 1), (rounds, cfg.backend)
