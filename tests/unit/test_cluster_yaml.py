"""The shipped cluster-launcher files pass Ray's own validation (what `ray up` checks before it touches a machine)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = ("cluster.yaml", "cluster-onprem.yaml")


def _load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / name).read_text())
    return loaded


def _validate(raw: dict[str, Any]) -> dict[str, Any]:
    """``prepare_config`` (Ray's defaults merged in) then ``validate_config`` (schema and cross-field checks); the
    local provider's bootstrap too, which is offline (the AWS one needs boto3 and credentials)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg: dict[str, Any] = prepare_config(copy.deepcopy(raw))
    validate_config(cfg)
    if cfg["provider"]["type"] == "local":
        from ray.autoscaler._private.commands import _bootstrap_config

        cfg = _bootstrap_config(cfg, no_config_cache=True)
    return cfg


def _rejections() -> tuple[type[BaseException], ...]:
    import click
    import jsonschema

    return (jsonschema.ValidationError, ValueError, RuntimeError, click.ClickException)


@pytest.mark.parametrize("name", FILES)
def test_cluster_file_validates(name: str) -> None:
    raw = _load(name)
    cfg = _validate(raw)
    assert cfg["cluster_name"].startswith("rayfl")
    # every node gets this working tree and installs it
    assert raw["file_mounts"] == {"~/rayfl": "."}
    assert any("pip install" in cmd and "~/rayfl" in cmd for cmd in raw["setup_commands"])


@pytest.mark.parametrize("name", FILES)
def test_header_gives_the_commands(name: str) -> None:
    header = [line for line in (ROOT / name).read_text().splitlines() if line.startswith("#")]
    text = "\n".join(header)
    commands = (
        f"ray up {name}",
        "ray job submit",
        "rayfl run experiments/",
        "rayfl sweep experiments/",
        f"ray down {name}",
    )
    for command in commands:
        assert command in text, command
    assert (ROOT / "experiments/mini/shakespeare_bert.yaml").is_file()  # the experiment the header runs


def test_aws_head_is_reserved_for_the_driver_and_workers_have_one_gpu_each() -> None:
    types = _load("cluster.yaml")["available_node_types"]
    assert types["head"]["resources"] == {"CPU": 0}  # no host, trial or CPU-reserving shard lands beside the GCS
    assert types["gpu_worker"]["resources"] == {"CPU": 8, "GPU": 1}
    assert types["gpu_worker"]["node_config"]["InstanceType"] == "g5.2xlarge"


def test_local_provider_lists_its_machines() -> None:
    raw = _load("cluster-onprem.yaml")
    assert any("--head --num-cpus=0 --num-gpus=0" in cmd for cmd in raw["head_start_ray_commands"])
    cfg = _validate(raw)
    assert cfg["provider"]["head_ip"] and len(cfg["provider"]["worker_ips"]) == 2
    assert cfg["max_workers"] == 2  # the local provider caps workers at the list's length


@pytest.mark.parametrize("name", FILES)
def test_an_unknown_key_is_rejected(name: str) -> None:
    broken = _load(name)
    broken["max_wrokers"] = 2
    with pytest.raises(_rejections(), match="max_wrokers"):
        _validate(broken)


def test_a_fractional_gpu_resource_is_rejected() -> None:
    broken = _load("cluster.yaml")
    broken["available_node_types"]["gpu_worker"]["resources"]["GPU"] = 0.5
    with pytest.raises(_rejections(), match=r"0\.5 is not of type 'integer'"):
        _validate(broken)


def test_a_local_provider_without_a_head_is_rejected() -> None:
    broken = _load("cluster-onprem.yaml")
    del broken["provider"]["head_ip"]
    with pytest.raises(_rejections(), match="head_ip"):
        _validate(broken)
