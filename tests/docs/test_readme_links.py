"""The README's links lead somewhere: every relative link names a file of the repository and, with ``#anchor``, a
heading of it. (The pages under ``docs/`` are checked by ``mkdocs build --strict`` in ``.ci/run``; the README is not
part of the site.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub and MkDocs write it: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M)}


def test_every_relative_link_of_the_readme_resolves() -> None:
    readme = ROOT / "README.md"
    text = FENCE.sub("", readme.read_text(encoding="utf-8"))
    targets = [m.group(1) for m in LINK.finditer(text) if not re.match(r"[a-z]+:", m.group(1))]
    assert targets, "no relative links found"
    broken = []
    for target in targets:
        file, _, anchor = target.partition("#")
        path = readme if not file else ROOT / file
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            broken.append(target)
    assert not broken, f"README.md links to what does not exist: {broken}"


def test_anchors_are_spelled_as_github_spells_them() -> None:
    assert _anchor("Issue 13's targets") == "issue-13s-targets"
    assert _anchor("FedHeN (paper 001)") == "fedhen-paper-001"
    assert _anchor("The `param_space` entries") == "the-param_space-entries"
