"""Every cluster node and the cluster image install the same builds (issue 45, item 6): the cluster files and
docker/Dockerfile install from requirements/cluster.lock with pip's hash checking, and the lock pins, with hashes,
every dependency that pyproject.toml declares, at versions its ranges admit."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = "requirements/cluster.lock"
CLUSTER_FILES = ("cluster.yaml", "cluster-onprem.yaml")
DOCKERFILE = ROOT / "docker/Dockerfile"
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")
COMMAND_LISTS = ("setup_commands", "head_setup_commands", "worker_setup_commands")


def _lock_entries(text: str) -> list[str]:
    """The lock's requirement entries, continuation lines joined; comment and blank lines left out."""
    lines = (line.split(" #", 1)[0].strip() for line in text.replace("\\\n", " ").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _pins(text: str) -> dict[str, Version]:
    """Each locked package's normalized name -> its pinned version; fails on an entry that is not ``name==version``
    with at least one sha256."""
    pins: dict[str, Version] = {}
    for entry in _lock_entries(text):
        requirement, _, rest = entry.partition(" ")
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^=;\s]+)", requirement)
        assert match, f"not pinned with ==: {entry[:80]}"
        hashes = rest.split()
        assert hashes and all(HASH.fullmatch(h) for h in hashes), f"no sha256 for {requirement}"
        name = canonicalize_name(match[1])
        assert name not in pins, f"{name} pinned twice"
        pins[name] = Version(match[2])
    return pins


def _declared() -> list[Requirement]:
    """pyproject.toml's [project].dependencies."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on, as in CI
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(dep) for dep in project["dependencies"]]


def _cluster_inputs() -> list[Requirement]:
    """What requirements/cluster.in adds beside pyproject.toml's dependencies."""
    return [Requirement(line) for line in _lock_entries((ROOT / "requirements/cluster.in").read_text())]


def _pip_installs(command: str) -> list[list[str]]:
    """The arguments after ``pip install`` of each pip call in a shell command line."""
    words = shlex.split(command.replace(";", " ; ").replace("&&", " && ").replace("||", " || "))
    calls: list[list[str]] = []
    for i, word in enumerate(words[:-1]):
        if Path(word).name in ("pip", "pip3") and words[i + 1] == "install":
            args = []
            for arg in words[i + 2 :]:
                if arg in (";", "&&", "||"):
                    break
                args.append(arg)
            calls.append(args)
    return calls


def _locked_install(args: list[str], lock_path: str) -> bool:
    """Whether a pip call installs the requirements file ``lock_path`` with hash checking (pip then refuses any
    package, named or pulled in, that the file does not pin with a hash)."""
    return "--require-hashes" in args and lock_path in args and args[args.index(lock_path) - 1] == "-r"


@pytest.fixture(scope="module")
def pins() -> dict[str, Version]:
    return _pins((ROOT / LOCK).read_text())


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_cluster_file_installs_from_the_lock(name: str) -> None:
    raw = yaml.safe_load((ROOT / name).read_text())
    synced_lock = f"~/rayfl/{LOCK}"  # file_mounts syncs the working tree to ~/rayfl
    assert raw["file_mounts"] == {"~/rayfl": "."}
    setup = [call for cmd in raw["setup_commands"] for call in _pip_installs(cmd)]
    locked = [i for i, args in enumerate(setup) if _locked_install(args, synced_lock)]
    rayfl = [i for i, args in enumerate(setup) if args[-1:] == ["~/rayfl"]]
    assert locked, f"{name}: no setup command runs pip install --require-hashes -r {synced_lock}"
    assert rayfl and locked[0] < rayfl[0], f"{name}: rayfl is not installed after the lock"
    for args in (setup[i] for i in rayfl):
        assert "--no-deps" in args, f"{name}: rayfl's install resolves dependencies of its own: {args}"
        assert "--no-build-isolation" in args, f"{name}: rayfl's build fetches unlocked build tools: {args}"
    # nothing else is pip-installed on any node: a package outside the lock would differ from day to day
    for key in COMMAND_LISTS:
        for cmd in raw.get(key) or []:
            for args in _pip_installs(cmd):
                assert _locked_install(args, synced_lock) or args[-1:] == ["~/rayfl"], f"{name} {key}: {cmd}"


def test_every_line_of_the_lock_is_pinned_with_a_hash() -> None:
    pins = _pins((ROOT / LOCK).read_text())  # asserts on each entry
    assert {"ray", "torch", "torchvision"} <= set(pins) and len(pins) > 20  # their dependencies too


def test_the_lock_covers_every_declared_dependency_within_its_range(pins: dict[str, Version]) -> None:
    for requirement in (*_declared(), *_cluster_inputs()):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in {LOCK}: run `bash requirements/lock.sh`"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{LOCK} pins {name}=={pins[name]}"


def test_the_locked_torch_is_in_the_declared_range(pins: dict[str, Version]) -> None:
    (torch,) = (r for r in _declared() if r.name == "torch")
    assert torch.specifier.contains(pins["torch"]), f"{LOCK} pins torch=={pins['torch']} outside {torch}"
    assert pins["torch"].local is None  # PyPI's build, not a local one (+cpu, +cu130) from another index


def test_the_dockerfile_installs_from_the_same_lock() -> None:
    lines = DOCKERFILE.read_text().replace("\\\n", " ").splitlines()
    copies = [shlex.split(line)[1:] for line in lines if line.startswith("COPY ")]
    (copied,) = (dest for *sources, dest in copies if sources == [LOCK])
    runs = [call for line in lines if line.startswith("RUN ") for call in _pip_installs(line[4:])]
    locked = [i for i, args in enumerate(runs) if _locked_install(args, copied)]
    rayfl = [i for i, args in enumerate(runs) if not _locked_install(args, copied)]
    assert locked, f"docker/Dockerfile does not run pip install --require-hashes -r {copied}"
    assert all("--no-deps" in runs[i] and "--no-build-isolation" in runs[i] for i in rayfl)
    assert rayfl and locked[0] < rayfl[0]


def test_the_image_has_the_python_the_lock_is_made_for() -> None:
    (base,) = (line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("FROM "))
    locked_for = re.search(r"LOCK_PYTHON:-([0-9.]+)", (ROOT / "requirements/lock.sh").read_text())
    assert locked_for and base.startswith(f"python:{locked_for[1]}-"), base


def test_a_lock_line_without_a_hash_or_pin_is_refused() -> None:
    good = "numpy==2.0.0 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via rayfl\n"
    assert _pins(good) == {"numpy": Version("2.0.0")}
    for bad in ("numpy==2.0.0\n", "numpy>=2.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"):
        with pytest.raises(AssertionError):
            _pins(bad)
