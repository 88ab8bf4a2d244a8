"""``rayfl --help`` speaks to users (``rayfl/cli_help.py``): the overview says what rayfl does, every sub-command's
help says what it does and gives examples, and every file an example names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayfl.cli import main
from rayfl.cli_help import COMMANDS

REPO = Path(__file__).resolve().parents[2]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_the_overview_is_for_users(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help([], capsys)
    assert "rayfl simulates federated learning" in out and "No logic beyond wiring" not in out
    for name, words in COMMANDS.items():
        assert name in out and words.summary[:30] in " ".join(out.split())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_says_what_it_does_and_shows_examples(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _help([name], capsys)
    flat = " ".join(out.split())
    assert COMMANDS[name].description.split(".")[0] in flat
    examples = out.split("examples:\n", 1)[1].splitlines()
    assert examples and all(line.strip().startswith(f"rayfl {name}") for line in examples if line.strip())
    for path in re.findall(r"(?:examples|experiments|traces|rayfl/configs)/\S+\.(?:yaml|csv)", out):
        assert (REPO / path).is_file(), path
