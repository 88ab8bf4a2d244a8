"""Every documented command runs (issue 44, item 4): each command of every ```bash, ```sh, ```shell and ```console
block in ``README.md`` and ``docs/*.md`` is run here, at reduced size, in a temporary copy of the folders the commands
use (``experiments``, ``examples``, ``traces``, ``benchmarks``, the cluster files), so no documented command rots.

How a command runs:

* ``rayfl run ...`` with ``SMALL_RUN`` appended (one round of two clients, in-process) and the command's own
  ``RUN_EXTRA``; any other ``rayfl`` command but ``sweep``/``search`` as written. Both through ``rayfl.cli.main`` in
  this process (no second torch import per command), unless the block starts Ray;
* a command in ``REDUCED``: its reduced form (the same script with the size arguments its own docs give);
* a command in ``AS_WRITTEN`` (scripts that read committed records: seconds): as written;
* a command in ``SKIPPED``: not at all, for the reason given there.

``test_every_documented_command_is_run_or_listed`` fails for a command that fits none of these (a new ``python`` or
``bash`` command must be listed) and for a listed command no page holds any more. Blocks that start Ray (sweeps) run
in one subprocess each, marked ``ray``. Commands are keyed by their text as written, continuation lines joined with
one space and the trailing ``# comment`` left out.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SHELL_FENCES = ("bash", "sh", "shell", "console")
COPIED = ("experiments", "examples", "traces", "benchmarks", "cluster.yaml", "cluster-onprem.yaml")
TIMEOUT_S = 300

# The mahimahi cellular set is fetched into the cache (`rayfl traces fetch`); its shipped subset replays real links
# without the network, as docs/traces.md says.
LITE_TRACES = (
    "system.bandwidth_down.directory=trace-set:mahimahi-cellular-lite",
    "system.bandwidth_up.directory=trace-set:mahimahi-cellular-lite",
)
SMALL_RUN = ("rounds=1", "eval_every=1", "clients_per_round=2", "backend.kind=local")

# `rayfl run` commands: overrides appended after SMALL_RUN, for configs that need more than it to be small
RUN_EXTRA: dict[str, tuple[str, ...]] = {
    "rayfl run": ("data.num_clients=4",),
    "rayfl run experiments/default_system.yaml": ("data.num_clients=4", *LITE_TRACES),
    "rayfl run experiments/paper/cpu/setting6.yaml algorithm.name=heterofl server.policy=fedbuff "
    "server.concurrency=10 server.buffer_size=5 rounds=60": (
        "server.concurrency=2",
        "server.buffer_size=1",
        *LITE_TRACES,
    ),
    # three phases (their rounds must add up to rounds): one round each, a two-point search, one local epoch
    "rayfl run experiments/fedoras/cpu.yaml": (
        "rounds=3",
        "eval_every=3",
        "phases.0.rounds=1",
        "phases.1.rounds=1",
        "phases.2.rounds=1",
        "phases.0.epochs=1",
        "phases.1.algorithm.population=2",
        "phases.1.algorithm.parents=2",
        "phases.1.algorithm.max_evaluations=2",
        "phases.1.algorithm.val_examples=32",
        "phases.1.algorithm.workers=1",
        "phases.2.clients_per_round=4",
        "phases.2.epochs=1",
        "data.synthetic_samples=32",
    ),
}

# Commands run in a reduced form: the documented command -> what runs (the script's own size arguments)
REDUCED: dict[str, str] = {
    'METHODS="largest smallest model_search-no-distill fjord" bash experiments/paper/run_cpu.sh 3': (
        "METHODS=smallest bash experiments/paper/run_cpu.sh 3 -- " + " ".join(SMALL_RUN)
    ),
    "python benchmarks/async_events.py": "python benchmarks/async_events.py --n 200 --c 20 --b 5 --steps 2",
    "rayfl sweep experiments/sweeps/mini_methods.yaml": (
        "rayfl sweep experiments/sweeps/mini_methods.yaml param_space.algorithm.name=[heterofl] param_space.seed=[0] "
        "base.rounds=1 base.clients_per_round=2 base.data.num_clients=4 base.backend.kind=local "
        + " ".join(f"base.{o}" for o in LITE_TRACES)
    ),
    # the config names the whole mahimahi set, which a fresh clone (CI) has not fetched: its shipped subset instead
    "rayfl validate experiments/default_system.yaml": " ".join(
        ("rayfl validate experiments/default_system.yaml", *LITE_TRACES)
    ),
    "rayfl validate --explain experiments/default_system.yaml": " ".join(
        ("rayfl validate --explain experiments/default_system.yaml", *LITE_TRACES)
    ),
    "rayfl sweep experiments/sweeps/search_eps_tmax.yaml": (
        "rayfl sweep experiments/sweeps/search_eps_tmax.yaml param_space.algorithm.epsilon=[0.2] "
        "param_space.algorithm.t_max=[1] base.rounds=1 base.clients_per_round=4 base.data.num_clients=8 "
        + " ".join(f"base.{o}" for o in LITE_TRACES)
    ),
}

# Scripts that read committed records (or print a table): run as written, in seconds
AS_WRITTEN = frozenset(
    {
        "python experiments/issue40/table.py",
        "python experiments/mini/table.py",
        "python experiments/policies/compare.py --table",
        "python experiments/fedrescue/run_table.py --table-only --methods FedResCuE FedSlim FjORD HeteroFL",
    }
)

_CLUSTER = "launches or drives a Ray cluster on AWS (cluster.yaml); tests/integration/test_two_node.py and "
_CLUSTER += "test_cluster_sweeps.py cover the runs on a real and an emulated multi-node cluster"
_LOCK = "resolves against PyPI and rewrites the committed requirements/cluster.lock; tests/unit/test_cluster_lock.py "
_LOCK += "checks the lock it wrote (pinned, hashed, every dependency of pyproject.toml)"
_DOCKER = "needs Docker and pulls several GB of wheels; tests/unit/test_cluster_lock.py checks that the Dockerfile "
_DOCKER += "installs from the same lock as the cluster files"
_LONG = "a study's full runs ({}); its table comes from committed records by the command beside it"

# Commands not run here, by exact text, with the reason
SKIPPED: dict[str, str] = {
    "python3.11 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/rayfl run": (
        "creates a virtual environment and installs rayfl from the package index (network, minutes); the `rayfl run` "
        "it ends with runs here (README's first run)"
    ),
    "python3.11 -m venv .venv && .venv/bin/pip install -q -e '.[test,docs]' && .venv/bin/ruff check rayfl tests "
    "benchmarks && .venv/bin/mypy rayfl && .venv/bin/lint-imports && NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build "
    '--strict -q -d "$(mktemp -d)" && .venv/bin/pytest -q -n 2 --dist loadgroup': (
        "the whole test suite, this test included; .ci/run runs it"
    ),
    ".venv/bin/pip install -e '.[docs]' && .venv/bin/mkdocs serve": (
        "installs the docs extra from the package index and serves the site until stopped; .ci/run builds the site "
        "with mkdocs build --strict"
    ),
    "bash experiments/mini/run_all.sh": _LONG.format("eleven runs, about 25 minutes"),
    "bash experiments/fedhen/run_all.sh": _LONG.format("twelve runs of 100 rounds, about 5 CPU minutes each"),
    "python experiments/policies/compare.py": _LONG.format("16 runs of 300 client updates"),
    "PYTHONPATH=$PWD python experiments/fedtrans/run_table.py --seeds 0 1 2": _LONG.format(
        "3 methods x 3 seeds x 150 rounds"
    ),
    "PYTHONPATH=$PWD python experiments/fedtrans/run_table.py --config femnist.yaml --seeds 0 1": _LONG.format(
        "3 methods x 2 seeds x 150 rounds"
    ),
    "rayfl sweep experiments/sweeps/fedtrans_doc.yaml": (
        "12 trials of 120 FedTrans rounds under ASHA; the sweep machinery runs here on docs/sweeps.md's two sweeps "
        "and `rayfl run experiments/fedtrans/cpu.yaml` runs its base config"
    ),
    "python experiments/fedoras/run_table.py": _LONG.format("six configurations, each phase in full"),
    "python experiments/fedoras/path_updates.py": "reads the run directories run_table.py (skipped above) writes",
    "python benchmarks/fedoras_search.py --paths 16 --val 512 --repeats 2": (
        "a timing benchmark of 1 against 2 Ray workers, for a quiet machine with 2 free cores"
    ),
    "python experiments/fedrescue/run_table.py --methods FedResCuE FedSlim FjORD HeteroFL --seeds 0 1 --curves "
    "experiments/fedrescue/curves.png --bytes-plot experiments/fedrescue/bytes.png": _LONG.format(
        "4 methods x 3 error rates x 2 seeds x 120 rounds"
    ),
    "ray up cluster.yaml -y": _CLUSTER,
    "ray dashboard cluster.yaml &": _CLUSTER,
    "ray job submit --address http://127.0.0.1:8265 --working-dir . -- rayfl run "
    "experiments/mini/shakespeare_bert.yaml backend.address=auto backend.num_hosts=2 backend.cpus_per_host=2 "
    "backend.gpus_per_host=1 backend.torch_threads=2": _CLUSTER,
    "ray job submit --address http://127.0.0.1:8265 --working-dir . -- rayfl sweep "
    "experiments/sweeps/search_eps_tmax.yaml output_dir=s3://your-bucket/rayfl/sweeps": _CLUSTER,
    "ray down cluster.yaml -y": _CLUSTER,
    "bash requirements/lock.sh": _LOCK,
    "bash requirements/lock.sh --upgrade": _LOCK,
    "docker build -f docker/Dockerfile -t rayfl .": _DOCKER,
    'docker run --rm -v "$PWD":/workspace rayfl rayfl run experiments/mini/shakespeare_bert.yaml': _DOCKER,
}

# `rayfl` sub-commands that run as written (quick, local); `run` is made small; `sweep` and `search` must be listed
_RAYFL_AS_WRITTEN = ("validate", "report", "data", "traces", "export")


@dataclass(frozen=True)
class Block:
    """One shell block: where it is, its commands (keys as described in the module docstring) and, of those, the ones
    it runs here (``_distinct_blocks``)."""

    file: str
    line: int
    commands: tuple[str, ...]
    runs: tuple[str, ...] = ()

    @property
    def starts_ray(self) -> bool:
        return any(_runnable(c).startswith("rayfl sweep") for c in self.runs)


def _commands(body: str, console: bool) -> list[str]:
    """The commands of a block's text: continuation lines joined, comment lines and trailing comments left out; in a
    ``console`` block only the ``$ `` lines (the rest is output)."""
    lines: list[str] = []
    for raw in body.splitlines():
        if console:
            if not raw.startswith("$ "):
                continue
            raw = raw[2:]
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1].rstrip() + " " + raw.strip()
        else:
            lines.append(raw.strip())
    commands = []
    for line in lines:
        text = re.sub(r"\s+#\s.*$", "", line).strip()
        if text and not text.startswith("#"):
            commands.append(text)
    return commands


def shell_blocks() -> list[Block]:
    """Every shell block of the documentation, in file order."""
    fence = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)
    blocks = []
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        for m in fence.finditer(text):
            if m.group(1) in SHELL_FENCES:
                line = text.count("\n", 0, m.start()) + 1
                commands = tuple(_commands(m.group(2), console=m.group(1) == "console"))
                blocks.append(Block(str(path.relative_to(ROOT)), line, commands))
    return blocks


def _runnable(command: str) -> str:
    """What runs for ``command``, or ``""`` when it is neither run nor listed."""
    if command in REDUCED:
        return REDUCED[command]
    if command in AS_WRITTEN:
        return command
    words = command.split()
    if words[:2] == ["rayfl", "run"]:
        return " ".join((command, *SMALL_RUN, *RUN_EXTRA.get(command, ())))
    if words[:1] == ["rayfl"] and len(words) > 1 and words[1] in _RAYFL_AS_WRITTEN:
        return command
    return ""


def _distinct_blocks() -> list[Block]:
    """The blocks with something to run, each command run once: where a page repeats a command of an earlier block
    (README's first run in docs/running.md), the later block leaves it out (blocks that repeat a command another one
    depends on repeat the whole block, so nothing runs without what it needs)."""
    seen: set[str] = set()
    out = []
    for block in shell_blocks():
        runs = tuple(c for c in block.commands if c not in SKIPPED and c not in seen)
        seen.update(block.commands)
        if runs:
            out.append(Block(block.file, block.line, block.commands, runs))
    return out


def test_every_documented_command_is_run_or_listed() -> None:
    commands = [c for block in shell_blocks() for c in block.commands]
    assert commands, "no shell blocks found"
    unlisted = sorted({c for c in commands if c not in SKIPPED and not _runnable(c)})
    assert not unlisted, f"documented commands neither run here nor listed in SKIPPED (with a reason): {unlisted}"
    listed = {*SKIPPED, *REDUCED, *AS_WRITTEN, *RUN_EXTRA}
    stale = sorted(listed - set(commands))
    assert not stale, f"listed commands no page documents any more: {stale}"
    assert all(reason.strip() for reason in SKIPPED.values())


def test_commands_are_read_as_written() -> None:
    body = "rayfl run a.yaml \\\n    rounds=2   # a comment\n# a comment line\npython x.py --y 1\n"
    assert _commands(body, console=False) == ["rayfl run a.yaml rounds=2", "python x.py --y 1"]
    assert _commands("$ rayfl validate f.yaml\nf.yaml: OK\n", console=True) == ["rayfl validate f.yaml"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what the commands read and write, so nothing lands in the repository."""
    where = tmp_path_factory.mktemp("docs-commands")
    ignore = shutil.ignore_patterns("runs", "__pycache__", "*.pyc")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, where / name, ignore=ignore)
        else:
            shutil.copy2(source, where / name)
    return where


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # rayfl and python of this venv
    env.setdefault("OMP_NUM_THREADS", "1")
    env["MPLBACKEND"] = "Agg"
    return env


def _in_process(command: str) -> list[str] | None:
    """``rayfl`` arguments when ``command`` is a plain ``rayfl`` call (no shell syntax), else ``None``."""
    if re.search(r"[$&|;<>`]", command) or not command.startswith("rayfl "):
        return None
    return shlex.split(command)[1:]


def _run_in_shell(command: str, cwd: Path) -> None:
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"{command!r} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


# A block that starts Ray runs in one process of its own, so that the Ray it starts ends with it; its rayfl commands
# share that process (and its Ray), its other commands run in a shell.
_BLOCK_RUNNER = """
import json, subprocess, sys
from rayfl.cli import main
for argv, command in json.loads(sys.argv[1]):
    rc = main(argv) if argv is not None else subprocess.run(["bash", "-c", command]).returncode
    if rc != 0:
        sys.exit(f"{command!r} exited {rc}")
"""


def _params() -> Iterator[object]:
    for block in _distinct_blocks():
        marks = [pytest.mark.slow] + ([pytest.mark.ray] if block.starts_ray else [])
        yield pytest.param(block, id=f"{block.file}:{block.line}", marks=marks)


@pytest.mark.parametrize("block", list(_params()))
def test_documented_commands_run(
    block: Block, workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    to_run = [_runnable(c) for c in block.runs]
    if block.starts_ray:
        import json

        plan = json.dumps([(_in_process(c), c) for c in to_run])
        done = subprocess.run(
            [sys.executable, "-c", _BLOCK_RUNNER, plan],
            cwd=workdir,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, f"{block.file}:{block.line}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return
    import torch

    from rayfl.cli import main

    monkeypatch.chdir(workdir)
    threads = torch.get_num_threads()
    try:
        for command in to_run:
            argv = _in_process(command)
            if argv is None:
                _run_in_shell(command, workdir)
                continue
            rc = main(argv)
            out = capsys.readouterr()
            assert rc == 0, f"{command!r} exited {rc}:\n{out.out[-3000:]}\n{out.err[-3000:]}"
    finally:
        torch.set_num_threads(threads)
