"""One start-up path (``rayfl/engine/startup.py``): a run's config is resolved and its destination checked once,
whether it starts from ``rayfl run`` or from ``run_experiment``, and no factory resolves ``backend.kind`` again."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rayfl.cli import main
from rayfl.engine import backend_choice, startup
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from tests.helpers import tiny_image_dataset, tiny_yaml


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts of the start-up decisions: backend choices made (``choose_backend``, wherever it is called from) and
    output-directory and tracking checks (the names start-up and the command line call)."""
    calls: Counter[str] = Counter()

    def counting(name: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(backend_choice, "choose_backend", counting("backend", backend_choice.choose_backend))
    monkeypatch.setattr(startup, "check_output_dir", counting("output_dir", startup.check_output_dir))
    monkeypatch.setattr(startup, "check_tracking", counting("tracking", startup.check_tracking))
    return calls


def _auto_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    text = tiny_yaml("startup", 2).replace("backend: {{kind: local, num_hosts: 1}}", "backend: {{num_hosts: 1}}")
    path.write_text(text.format(out=tmp_path / "runs"))
    return path


def test_rayfl_run_decides_its_backend_and_checks_its_output_once(
    tmp_path: Path, counted: Counter[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(_auto_yaml(tmp_path))]) == 0
    assert dict(counted) == {"backend": 1, "output_dir": 1, "tracking": 1}, f"start-up decisions: {dict(counted)}"
    summary = json.loads((tmp_path / "runs" / "startup" / "summary.json").read_text())
    assert summary["backend"]["asked"] == "auto" and summary["backend"]["kind"] == "local", summary["backend"]
    assert "backend local (auto: " in capsys.readouterr().out


def test_run_experiment_plans_its_own_start_once(tmp_path: Path, counted: Counter[str]) -> None:
    cfg = load_config(str(_auto_yaml(tmp_path)), [])
    assert cfg.backend.kind == "auto"
    result = run_experiment(cfg)
    assert dict(counted) == {"backend": 1, "output_dir": 1, "tracking": 1}, f"start-up decisions: {dict(counted)}"
    summary = json.loads((result.run_dir / "summary.json").read_text())  # type: ignore[operator]
    assert summary["backend"]["asked"] == "auto", summary["backend"]


def test_a_run_that_writes_nothing_checks_no_output(counted: Counter[str], tmp_path: Path) -> None:
    cfg = load_config(str(_auto_yaml(tmp_path)), [])
    run_experiment(cfg, write=False)
    assert dict(counted) == {"backend": 1}, f"start-up decisions: {dict(counted)}"
    assert not (tmp_path / "runs").exists()


def test_a_factory_refuses_an_unresolved_backend_and_names_the_resolver(tmp_path: Path) -> None:
    cfg = load_config(str(_auto_yaml(tmp_path)), [])
    setup = build_setup(cfg, tiny_image_dataset())
    with pytest.raises(ValueError, match=r"backend\.kind 'auto'.*resolve_backend"):
        build_backend(cfg, setup)
    resolved, choice = backend_choice.resolve_backend(cfg)
    assert choice.kind == resolved.backend.kind == "local"
    build_backend(resolved, setup).close()
