"""Tests for rayfl.experiment.loader: YAML + overrides → validated ExperimentConfig, with located errors."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest
import yaml

from rayfl.config.model import CharLSTMConfig, CharTransformerConfig, CNNConfig, ResNetConfig
from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
from rayfl.core.errors import ConfigError
from rayfl.experiment.loader import config_to_dict, dump_config, load_config, validate_semantics
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedrolex.config import FedRolexConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def load_error(path: Path | None, overrides: tuple[str, ...] = ()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value


FULL_YAML = """
name: full
seed: 7
rounds: 3
clients_per_round: 4
eval_every: 2
output_dir: out
data:
  name: cifar10
  root: data
  download: false
  partition: dirichlet
  dirichlet_alpha: 0.3
  num_clients: 20
  min_samples: 1
  max_samples_per_client: 50
  test_fraction: 0.2
  seq_len: 16
  edition: both
  synthetic_samples: 8
model:
  name: cnn
  channels: [8, 16]
  norm: group
algorithm:
  name: fedavg
  weighting: uniform
  server_lr: 1
  server_momentum: 0.9
train:
  epochs: 2
  max_steps: 5
  batch_size: 32
  optimizer: adam
  lr: 1e-3
  momentum: 0.5
  weight_decay: 0.0001
  grad_clip_norm: 1.0
  lr_schedule: step
  lr_decay_rounds:
    - 1
    - 2
  lr_decay: 0.5
  eval_batch_size: 64
backend:
  kind: local
  num_hosts: 3
  num_shards: 2
  cpus_per_host: 0.5
  gpus_per_host: 0
  cpus_per_shard: 0.25
  torch_threads: 2
  address: auto
  num_cpus: 4
  object_store_mb: 128
system:
  memory:
    source: levels
    values: [1500, 2000]
  bandwidth_down:
    source: uniform
    low: 1
    high: 180
  bandwidth_up:
    source: binary
    low: 1
    high: 10
    per_round: false
  comm_limit_s: 30
  deadline_s: 600
"""


# ---------------------------------------------------------------------------------------- happy paths
def test_none_gives_the_default_experiment() -> None:
    cfg = load_config(None)
    assert cfg == ExperimentConfig()
    assert isinstance(cfg.model, CharLSTMConfig)
    assert cfg.data.root is None


def test_no_file_gives_the_schema_defaults() -> None:
    assert load_config(None) == ExperimentConfig()  # an empty *file* is refused (issue 26, test at the end)


def test_full_yaml_loads_every_value(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    cfg = load_config(write(tmp_path, FULL_YAML))
    assert cfg.name == "full" and cfg.seed == 7 and cfg.output_dir == "out"
    assert cfg.data.root == str((tmp_path / "data").resolve())
    assert cfg.data.edition == "both"
    assert cfg.model == CNNConfig(channels=(8, 16), norm="group")
    # an int is accepted for a float field and stored as a float
    assert cfg.algorithm.server_lr == 1.0 and isinstance(cfg.algorithm.server_lr, float)
    assert isinstance(cfg.backend.gpus_per_host, float)
    # '1e-3' (no dot) is read as a float, not as the string PyYAML's YAML 1.1 rules would give
    assert cfg.train.lr == pytest.approx(1e-3)
    assert cfg.train.lr_decay_rounds == (1, 2)
    assert cfg.backend == BackendConfig(
        kind="local",
        num_hosts=3,
        num_shards=2,
        cpus_per_host=0.5,
        gpus_per_host=0.0,
        cpus_per_shard=0.25,
        torch_threads=2,
        address="auto",
        num_cpus=4,
        object_store_mb=128,
    )


def test_full_yaml_round_trips_through_dump_config(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    cfg = load_config(write(tmp_path, FULL_YAML))
    out = tmp_path / "dumped" / "config.yaml"
    dump_config(cfg, out)
    assert load_config(out) == cfg
    # keys come out in dataclass field order
    dumped = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert list(dumped) == [
        "name",
        "setting",
        "seed",
        "rounds",
        "clients_per_round",
        "eval_every",
        "eval_widths",
        "eval_all_devices",
        "output_dir",
        "data",
        "model",
        "algorithm",
        "train",
        "backend",
        "system",
        "server",
        "compression",
        "phases",
        "checkpoint",
        "max_nonfinite_rounds",
        "export",
        "tracking",
    ]
    assert list(dumped["train"])[:3] == ["epochs", "max_steps", "batch_size"]


def test_round_trip_keeps_strings_that_look_like_numbers(tmp_path: Path) -> None:
    cfg = load_config(None, ["name='1e5'", "backend.address='10.0.0.1:6379'"])
    assert cfg.name == "1e5"
    out = tmp_path / "c.yaml"
    dump_config(cfg, out)
    assert load_config(out) == cfg


def test_config_to_dict_is_plain_data() -> None:
    cfg = load_config(
        None, ["data.name=synthetic", "model.name=cnn", "train.lr_schedule=step", "train.lr_decay_rounds=[3, 6]"]
    )
    as_dict = config_to_dict(cfg)
    assert as_dict["model"] == {"name": "cnn", "channels": [64, 128, 256, 512], "norm": "none"}
    assert as_dict["train"]["lr_decay_rounds"] == [3, 6]
    # safe_dump refuses tuples and dataclasses, so this proves the dict is plain
    assert yaml.safe_load(yaml.safe_dump(as_dict)) == as_dict
    with pytest.raises(TypeError):
        config_to_dict({"not": "a dataclass"})


def test_null_is_accepted_for_optional_fields(tmp_path: Path) -> None:
    path = write(tmp_path, "data:\n  root: null\nbackend:\n  address: ~\n")
    cfg = load_config(path)
    assert cfg.data.root is None and cfg.backend.address is None


def test_anchors_and_merge_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        data: &shared
          num_clients: 5
        clients_per_round: 5
        train:
          <<: {epochs: 3, lr: 0.5}
          lr: 0.2
        """,
    )
    cfg = load_config(path)
    assert cfg.data.num_clients == 5
    assert cfg.train.epochs == 3  # merged in
    assert cfg.train.lr == 0.2  # an explicit key beats the merged one (not a duplicate)


# ---------------------------------------------------------------------------------------- file errors
def test_unknown_key_names_line_and_suggests(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        rounds: 3
        train:
          epochs: 1
          lrr: 0.1
        """,
    )
    err = load_error(path)
    assert err.key_path == "train.lrr"
    assert err.file == str(path)
    assert err.line == 4
    assert f"{path}:4: train.lrr:" in str(err)
    assert "did you mean 'lr'" in str(err)


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nround: 3\n")
    err = load_error(path)
    assert err.key_path == "round" and err.line == 2
    assert "did you mean 'rounds'" in str(err)


def test_unknown_key_far_from_any_lists_valid_keys(tmp_path: Path) -> None:
    err = load_error(write(tmp_path, "backend:\n  zzzzzz: 1\n"))
    assert err.key_path == "backend.zzzzzz" and err.line == 2
    assert "valid keys:" in str(err) and "num_shards" in str(err)


def test_key_of_another_variant_points_at_the_name(tmp_path: Path) -> None:
    err = load_error(write(tmp_path, "model:\n  hidden_dim: 32\n  channels: [4]\n"))
    assert err.key_path == "model.channels" and err.line == 3
    assert "'cnn'" in str(err) and "model.name" in str(err)


@pytest.mark.parametrize(
    ("text", "key_path", "line", "fragment"),
    [
        ("seed: 1\nrounds: true\n", "rounds", 2, "expected an integer, got bool true"),
        ("train:\n  epochs: 1.5\n", "train.epochs", 2, "expected an integer"),
        ("train:\n  lr: fast\n", "train.lr", 2, "expected a number, got str 'fast'"),
        ("train:\n  lr: false\n", "train.lr", 2, "got bool false"),
        ("train:\n\n  lr: null\n", "train.lr", 3, "got null"),
        ("data:\n  download: 1\n", "data.download", 2, "expected a boolean"),
        ("name: 12\n", "name", 1, "expected a string, got int 12"),
        ("output_dir: [a]\n", "output_dir", 1, "expected a string"),
        (
            "model:\n  name: cnn\n  channels: 8\n",
            "model.channels",
            3,
            "expected a list of integers, got int 8",
        ),
        ("backend:\n  address: 5\n", "backend.address", 2, "expected a string"),
    ],
)
def test_wrong_types(tmp_path: Path, text: str, key_path: str, line: int, fragment: str) -> None:
    path = write(tmp_path, text)
    err = load_error(path)
    assert err.key_path == key_path
    assert err.line == line
    assert str(err).startswith(f"{path}:{line}: {key_path}: ")
    assert fragment in str(err)


def test_wrong_type_inside_a_block_list_names_the_item_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        model:
          name: cnn
          channels:
            - 8
            - 16
            - wide
        """,
    )
    err = load_error(path)
    assert err.key_path == "model.channels[2]"
    assert err.line == 6
    assert "expected an integer, got str 'wide'" in str(err)


def test_bool_is_not_an_int_inside_a_tuple(tmp_path: Path) -> None:
    err = load_error(write(tmp_path, "model:\n  name: cnn\n  channels: [8, true]\n"))
    assert err.key_path == "model.channels[1]" and err.line == 3


def test_literal_choices_are_listed(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  epochs: 1\n  optimizer: adamw\n")
    err = load_error(path)
    assert err.key_path == "train.optimizer" and err.line == 3
    assert "must be one of 'sgd', 'adam', got str 'adamw'" in str(err)


def test_out_of_range_number_matches_documented_message(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 0\ntrain:\n  epochs: 1\n  lr: -1\n")
    err = load_error(path)
    assert str(err) == f"{path}:4: train.lr: must be > 0, got -1.0"
    assert (err.key_path, err.file, err.line) == ("train.lr", str(path), 4)


@pytest.mark.parametrize(
    ("text", "key_path", "fragment"),
    [
        ("data:\n  test_fraction: 1.0\n", "data.test_fraction", "must be > 0 and < 1, got 1.0"),
        ("train:\n  momentum: 1\n", "train.momentum", "must be >= 0 and < 1, got 1.0"),
        ("data:\n  seq_len: 1\n", "data.seq_len", "must be >= 2, got 1"),
        ("rounds: 0\n", "rounds", "must be >= 1, got 0"),
        ("train:\n  lr_decay: 1.5\n", "train.lr_decay", "<= 1"),
        ("backend:\n  max_actor_failures: -1\n", "backend.max_actor_failures", "must be >= 0, got -1"),
    ],
)
def test_bounds(tmp_path: Path, text: str, key_path: str, fragment: str) -> None:
    path = write(tmp_path, text)
    err = load_error(path)
    assert err.key_path == key_path
    assert err.line == text.count("\n")  # the offending value is on the last line
    assert fragment in str(err)


def test_missing_directory_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 1\ndata:\n  root: no/such/dir\n")
    err = load_error(path)
    assert err.key_path == "data.root" and err.line == 3
    assert "does not exist" in str(err)
    assert str(tmp_path / "no" / "such" / "dir") in str(err)


def test_file_where_a_directory_is_expected(tmp_path: Path) -> None:
    (tmp_path / "plain.txt").write_text("x", encoding="utf-8")
    err = load_error(write(tmp_path, "data:\n  root: plain.txt\n"))
    assert err.key_path == "data.root" and "is not a directory" in str(err)


def test_unknown_variant_lists_known_names(tmp_path: Path) -> None:
    path = write(tmp_path, "rounds: 2\nmodel:\n  name: cnnn\n")
    err = load_error(path)
    assert err.key_path == "model.name" and err.line == 3
    assert "'char_lstm', 'char_transformer', 'cnn'" in str(err)
    assert "did you mean 'cnn'" in str(err)
    err = load_error(write(tmp_path, "algorithm:\n  name: scaffold\n", "b.yaml"))
    assert err.key_path == "algorithm.name" and "known: 'fedavg'" in str(err)


@pytest.mark.parametrize(
    ("text", "key_path", "line"),
    [
        ("seed: 1\ntrain: 5\n", "train", 2),
        ("model: cnn\n", "model", 1),
        ("data:\n  - cifar10\n", "data", 1),
        ("algorithm: null\n", "algorithm", 1),
    ],
)
def test_non_mapping_section(tmp_path: Path, text: str, key_path: str, line: int) -> None:
    path = write(tmp_path, text)
    err = load_error(path)
    assert err.key_path == key_path and err.line == line
    assert "expected a mapping" in str(err)
    assert str(path) in str(err)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    err = load_error(write(tmp_path, "- a\n- b\n"))
    assert err.key_path == "" and err.line == 1
    assert "top level must be a mapping" in str(err)


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 1\ntrain:\n  lr: [0.1, 0.2\n  epochs: 1\nrounds: 2\n")
    err = load_error(path)
    assert err.file == str(path)
    assert err.line == 4  # where the parser gave up ...
    assert str(err).startswith(f"{path}:4: invalid YAML")
    assert "(from line 3)" in str(err)  # ... and where the unclosed list began
    err = load_error(write(tmp_path, "seed: 1\nrounds: 2\n  epochs: 3\n", "indent.yaml"))
    assert err.line == 3


def test_duplicate_key_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  lr: 0.1\n  epochs: 1\n  lr: 0.2\n")
    err = load_error(path)
    assert err.key_path == "train.lr" and err.line == 4
    assert "duplicate key" in str(err)


def test_unsafe_tag_is_refused(tmp_path: Path) -> None:
    err = load_error(write(tmp_path, "seed: 1\nname: !!python/name:os.system ''\n"))
    assert err.line == 2 and "invalid YAML" in str(err)


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    err = load_error(missing)
    assert err.file == str(missing) and "does not exist" in str(err)


# ---------------------------------------------------------------------------------------- semantics
def test_too_many_shards_from_file(tmp_path: Path) -> None:
    path = write(tmp_path, "backend:\n  kind: local\n  num_shards: 65\n")
    err = load_error(path)
    assert err.key_path == "backend.num_shards" and err.line == 3
    assert "must be <= 64, got 65" in str(err)
    assert load_config(None, ["backend.num_shards=64"]).backend.num_shards == 64


def test_step_schedule_needs_decay_rounds(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  lr_schedule: step\n")
    err = load_error(path)
    assert err.key_path == "train.lr_decay_rounds"
    assert err.line == 1  # the key is absent: the error points at its section
    assert "train.lr_schedule is 'step'" in str(err)


def test_step_decay_rounds_must_increase(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  lr_schedule: step\n  lr_decay_rounds:\n    - 5\n    - 9\n    - 9\n")
    err = load_error(path)
    assert err.key_path == "train.lr_decay_rounds[2]" and err.line == 6
    assert "strictly increasing" in str(err)
    # other schedules do not care about the list
    cfg = load_config(None, ["train.lr_schedule=cosine", "train.lr_decay_rounds=[9, 5]"])
    assert cfg.train.lr_decay_rounds == (9, 5)


def test_validate_semantics_on_a_config_built_in_code() -> None:
    validate_semantics(ExperimentConfig())
    bad = ExperimentConfig(train=TrainConfig(lr_schedule="step", lr_decay_rounds=(4, 2)))
    with pytest.raises(ConfigError) as info:
        validate_semantics(bad)
    assert info.value.key_path == "train.lr_decay_rounds[1]"
    with pytest.raises(ConfigError, match=r"backend\.num_shards"):
        validate_semantics(ExperimentConfig(backend=BackendConfig(num_shards=100)))


# ---------------------------------------------------------------------------------------- overrides
def test_overrides_of_each_type(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            "rounds=7",
            "train.lr=0.05",
            "train.weight_decay=5e-4",
            "train.momentum=0",
            "data.name=cifar10",
            "data.download=true",
            "backend.kind=local",
            "name=my run",
            "backend.address=auto",
            "model.name=cnn",
            "model.channels=[8,16]",
        ],
    )
    assert cfg.rounds == 7
    assert cfg.train.lr == 0.05
    assert cfg.train.weight_decay == pytest.approx(5e-4)
    assert cfg.train.momentum == 0.0 and isinstance(cfg.train.momentum, float)
    assert cfg.data.download is True
    assert cfg.backend.kind == "local"
    assert cfg.name == "my run"
    assert cfg.backend.address == "auto"
    assert cfg.model == CNNConfig(channels=(8, 16))


def test_override_wins_over_file_and_null_resets_optional(tmp_path: Path) -> None:
    path = write(tmp_path, "rounds: 3\nbackend:\n  address: auto\n  num_hosts: 4\n")
    cfg = load_config(path, ["rounds=9", "backend.address=null"])
    assert cfg.rounds == 9
    assert cfg.backend.address is None
    assert cfg.backend.num_hosts == 4  # untouched file value survives


def test_override_can_set_a_whole_section() -> None:
    cfg = load_config(None, ["model={name: char_transformer, dim: 64}"])
    assert cfg.model == CharTransformerConfig(dim=64)


def test_bad_override_value_names_the_override(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  lr: 0.1\n")
    err = load_error(path, ("train.lr=-1",))
    assert str(err) == f"{path}: override 'train.lr=-1': train.lr: must be > 0, got -1.0"
    assert err.override == "train.lr=-1" and err.line is None and err.key_path == "train.lr"


def test_override_without_file_still_names_a_location() -> None:
    err = load_error(None, ("train.optimizer=rmsprop",))
    assert err.key_path == "train.optimizer"
    assert "override 'train.optimizer=rmsprop'" in str(err)
    assert "'sgd', 'adam'" in str(err)


@pytest.mark.parametrize("override", ["train.lr", "=3", "train..lr=1", ".lr=1", "train.=1"])
def test_malformed_override(override: str) -> None:
    err = load_error(None, (override,))
    assert err.override == override
    assert f"override '{override}'" in str(err)
    assert "KEY.PATH=VALUE" in str(err)


def test_override_with_unknown_key_path(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 1\n")
    err = load_error(path, ("train.learning_rate=0.1",))
    assert err.key_path == "train.learning_rate"
    assert err.override == "train.learning_rate=0.1"
    assert str(path) in str(err)
    err = load_error(path, ("trian.lr=0.1",))
    assert err.key_path == "trian" and "did you mean 'train'" in str(err)


def test_override_with_invalid_yaml_value() -> None:
    err = load_error(None, ("model.channels=[8, 16",))
    assert err.override == "model.channels=[8, 16" and "invalid YAML" in str(err)


def test_override_into_a_scalar_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "rounds: 3\n")
    err = load_error(path, ("rounds.x=1",))
    assert err.key_path == "rounds" and err.override == "rounds.x=1"
    assert "not a mapping" in str(err)
    err = load_error(None, ("rounds.x=1",))
    assert err.key_path == "rounds" and "expected an integer, got a mapping" in str(err)


def test_override_indexes_list_items() -> None:
    path = Path(__file__).resolve().parents[2] / "experiments" / "fedoras" / "tiny_random.yaml"
    cfg = load_config(path, ("phases.0.rounds=7", "phases.-1.rounds=5", "rounds=12"))
    assert [p.rounds for p in cfg.phases] == [7, 5]
    err = load_error(path, ("phases.9.rounds=1",))
    assert err.key_path == "phases" and "not an index of this list of 2" in str(err)
    err = load_error(path, ("phases.x.rounds=1",))
    assert "'x' is not an index" in str(err)
    err = load_error(path, ("phases.0.rounds.a=1",))
    assert err.key_path == "phases[0].rounds" and "not a mapping" in str(err)


def test_overrides_must_be_a_sequence_of_strings() -> None:
    with pytest.raises(TypeError):
        load_config(None, "train.lr=0.1")


# ---------------------------------------------------------------------------------------- tagged switch
def test_switching_model_by_override_starts_from_variant_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  name: char_lstm\n  hidden_dim: 32\n  num_layers: 1\n")
    assert load_config(path).model == CharLSTMConfig(hidden_dim=32, num_layers=1)
    cfg = load_config(path, ["model.name=cnn", "data.name=synthetic"])
    assert cfg.model == CNNConfig()


def test_switching_keeps_keys_given_by_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  name: char_lstm\n  hidden_dim: 32\n")
    before = load_config(path, ["model.channels=[4]", "model.name=cnn", "data.name=synthetic"])
    after = load_config(path, ["model.name=cnn", "model.norm=batch", "data.name=synthetic"])
    assert before.model == CNNConfig(channels=(4,))
    assert after.model == CNNConfig(norm="batch")


def test_same_variant_override_keeps_file_keys(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  name: char_lstm\n  hidden_dim: 32\n")
    cfg = load_config(path, ["model.name=char_lstm"])
    assert cfg.model == CharLSTMConfig(hidden_dim=32)


def test_switching_from_the_default_variant_without_a_file() -> None:
    cfg = load_config(None, ["model.name=char_transformer", "model.heads=2"])
    assert cfg.model == CharTransformerConfig(heads=2)


def test_unknown_variant_by_override() -> None:
    err = load_error(None, ("model.name=perceptron",))
    assert err.key_path == "model.name" and "'char_lstm', 'char_transformer', 'cnn'" in str(err)


# ---------------------------------------------------------------------------------------- paths
def test_relative_path_resolves_against_the_yaml_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "datasets" / "cifar").mkdir(parents=True)
    path = write(tmp_path, "data:\n  root: ../datasets/cifar\n", "experiments/exp.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory must not matter for file values
    cfg = load_config(path)
    assert cfg.data.root == str((tmp_path / "datasets" / "cifar").resolve())
    assert Path(cfg.data.root).is_absolute()


def test_relative_path_in_override_resolves_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "here").mkdir()
    path = write(tmp_path, "seed: 1\n", "experiments/exp.yaml")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(path, ["data.root=here"])
    assert cfg.data.root == str((tmp_path / "here").resolve())


def test_home_relative_path_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(None, ["data.root=~/cache"])
    assert cfg.data.root == str((tmp_path / "cache").resolve())


# ---------------------------------------------------------------------------------------- the error type
def test_config_error_is_a_value_error_and_pickles(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  lr: 0\n")
    err = load_error(path)
    assert isinstance(err, ValueError)
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == str(err)
    assert (copy.key_path, copy.file, copy.line) == ("train.lr", str(path), 2)


def test_fedhen_needs_a_side_exit() -> None:
    err = load_error(None, ("algorithm.name=fedhen",))
    assert err.key_path == "model.side_exit"
    assert (
        load_config(
            None, ["data.name=synthetic", "algorithm.name=noside", "model.name=resnet", "model.side_exit=2"]
        ).model.side_exit
        == 2
    )


@pytest.mark.parametrize(
    ("override", "key_path"),
    [
        (("system.memory.source=uniform", "system.memory.low=2", "system.memory.high=1"), "system.memory.high"),
        (("system.memory.source=levels",), "system.memory.values"),
        (
            ("system.memory.source=levels", "system.memory.values=[1,2]", "system.memory.id_bounds=[1,2]"),
            "system.memory.id_bounds",
        ),
        (
            ("system.memory.source=levels", "system.memory.values=[1,2,3]", "system.memory.id_bounds=[5,2]"),
            "system.memory.id_bounds[1]",
        ),
        (
            ("system.memory.source=constant", "system.memory.low=1", "system.memory.id_bounds=[5]"),
            "system.memory.id_bounds",
        ),
        (("system.bandwidth_down.source=trace",), "system.bandwidth_down.file"),
        (("system.bandwidth_down.source=empirical",), "system.bandwidth_down.file"),
        (("system.compute.source=constant", "system.compute.low=0"), "system.compute.low"),
    ],
)
def test_resource_sources_need_their_fields(override: tuple[str, ...], key_path: str) -> None:
    err = load_error(None, override)
    assert err.key_path == key_path


# ------------------------------------------------------------------------------ the baselines' official set-up
RESNET = ("data.name=synthetic", "model.name=resnet")


@pytest.mark.parametrize(
    ("overrides", "act"),
    [
        (("algorithm.name=heterofl", "model.act=relu6"), "relu"),  # official: the ResNet's plain ReLU
        (("algorithm.name=fedrolex", "model.act=relu6"), "relu"),
        (("algorithm.name=heterofl", "model.act=relu6", "algorithm.act=model"), "relu6"),  # model.act kept
        (("algorithm.name=model_search", "model.act=relu6"), "relu6"),  # other methods never touch it
        (("algorithm.name=feddropout", "model.act=relu6"), "relu6"),
        (("algorithm.name=heterofl", "model.name=vit", "model.act=relu6"), "gelu"),  # the transformers' GELU
        (("algorithm.name=fedrolex", "model.name=char_bert", "model.act=relu6", "data.name=shakespeare"), "gelu"),
    ],
)
def test_official_activation_replaces_model_act(overrides: tuple[str, ...], act: str) -> None:
    cfg = load_config(None, [*RESNET, *overrides])
    assert cfg.model.act == act  # type: ignore[union-attr]
    assert load_config(None, [*RESNET, *overrides]) == cfg


def test_official_activation_holds_in_code_and_through_a_written_config(tmp_path: Path) -> None:
    """The resolution is the config's own (``ExperimentConfig``), so a config built in code gets it as well, and a
    written config reads back equal."""
    cfg = ExperimentConfig(
        data=DataConfig(name="synthetic"), model=ResNetConfig(act="relu6"), algorithm=HeteroFLConfig()
    )
    assert cfg.model == ResNetConfig(act="relu")
    assert ExperimentConfig(model=ResNetConfig(act="relu6"), algorithm=FedAvgConfig()).model.act == "relu6"
    assert ExperimentConfig(model=CNNConfig(), algorithm=FedRolexConfig()).model == CNNConfig()  # no act: untouched
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg


def test_phases_must_agree_on_the_official_activation(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        rounds: 4
        data: {name: synthetic}
        model: {name: resnet, act: relu6}
        phases:
          - {rounds: 2, algorithm: {name: heterofl, act: model}}
          - {rounds: 2, algorithm: {name: fedrolex}}
        """,
    )
    err = load_error(path)
    assert err.key_path == "phases[1].algorithm.act" and err.line == 6  # the second phase
    assert "'relu'" in err.reason and "'relu6'" in err.reason
    agree = load_config(path, ["phases.0.algorithm.act=official"])
    assert agree.model.act == "relu"  # type: ignore[union-attr]


def test_official_clipping_is_a_bounded_optional_number() -> None:
    assert load_config(None, ["algorithm.name=heterofl"]).algorithm.grad_clip_norm == 1.0  # type: ignore[union-attr]
    assert (
        load_config(None, ["algorithm.name=fedrolex", "algorithm.grad_clip_norm=null"]).algorithm.grad_clip_norm is None
    )  # type: ignore[union-attr]
    err = load_error(None, ("algorithm.name=heterofl", "algorithm.grad_clip_norm=-1"))
    assert err.key_path == "algorithm.grad_clip_norm" and ">= 0" in err.reason


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n#   and another\n", "{}\n"])
def test_a_file_that_sets_no_key_is_refused_in_one_line(tmp_path: Path, text: str) -> None:
    """Issue 26: an empty or comment-only file would run the schema's defaults, which nobody chose."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path)) and "sets no key" in message
