"""The method registry is the one table of methods: the docs' Methods page lists exactly its names, every row's config
and algorithm resolve, and each method lives in its own folder."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.registry import ALGORITHM_CONFIGS, METHODS, AlgorithmConfig, algorithm_class, import_object

ROOT = Path(__file__).resolve().parents[3]


def _documented_method_names() -> set[str]:
    """Every name in the first column of the method tables of ``docs/methods.md`` (headers ``| `algorithm.name` |``
    and ``| phase `algorithm.name` |``)."""
    names: set[str] = set()
    in_table = False
    for line in (ROOT / "docs" / "methods.md").read_text(encoding="utf-8").splitlines():
        if re.match(r"^\| (phase )?`algorithm\.name` \|", line):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            in_table = False
        if in_table and not line.startswith("|--") and not line.startswith("| ---"):
            first = line.split("|")[1]
            names.update(re.findall(r"`([a-z_0-9]+)`", first))
    return names


def test_the_methods_page_lists_exactly_the_registered_methods() -> None:
    assert _documented_method_names() == set(METHODS)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_row_resolves_to_its_config_and_algorithm(name: str) -> None:
    method = METHODS[name]
    config = method.config()
    assert config.name == name and ALGORITHM_CONFIGS[name] is method.config
    assert method.config in AlgorithmConfig.__args__  # the union the experiment schema is typed with
    cls = algorithm_class(name)
    assert issubclass(cls, Algorithm)
    folder = method.algorithm.split(":")[0].rsplit(".", 1)[0]
    assert folder.startswith("rayfl.fl.methods.") and method.config.__module__.startswith(folder)
    if method.rules is not None:
        assert callable(import_object(method.rules)) and method.rules.startswith(folder)
    assert {f.name for f in fields(method.config)} >= {"name"}


def test_the_registry_and_the_schema_import_neither_torch_nor_ray() -> None:
    code = (
        "import sys, rayfl.fl.registry, rayfl.experiment.loader; "
        "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
