"""A real Ray cluster of ``ray start --block`` processes on this machine, for the multi-node tests
(``tests/integration/test_two_node.py``, ``test_node_loss.py``).

Every process gets a private temp dir under one root and ``RAY_AUTH_MODE`` exported (docs: shared/reference/RAY.md
§2); nodes are stopped by SIGTERM to their own ``ray start`` PIDs (never ``ray stop``, which would end every Ray on the
machine), and ``processes_of(root)`` finds whatever of theirs is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent
OBJECT_STORE_BYTES = 100 << 20  # each raylet thinks it owns the machine: cap both stores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cluster_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    return env


def processes_of(root: str) -> list[psutil.Process]:
    """Every process whose command line names the cluster's private temp root (raylets, GCS, workers, agents)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.info["cmdline"] and any(root in part for part in proc.info["cmdline"]):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)  # `ray start --block` drains its node and stops what it spawned
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_node(
    temp_dir: str,
    env: Mapping[str, str],
    *,
    head_port: int | None = None,
    address: str | None = None,
    cpus: int = 1,
    system_config: Mapping[str, object] | None = None,
) -> subprocess.Popen[bytes]:
    """One ``ray start --block`` node: a head on ``head_port``, or a node joining ``address``."""
    args = [str(BIN / "ray"), "start"]
    if head_port is not None:
        args += ["--head", f"--port={head_port}", "--include-dashboard=false"]
        if system_config:
            args.append(f"--system-config={json.dumps(dict(system_config))}")
    else:
        args.append(f"--address={address}")
    args += [
        f"--temp-dir={temp_dir}",
        f"--num-cpus={cpus}",
        "--num-gpus=0",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        "--block",
    ]
    return subprocess.Popen(args, env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for_nodes(
    address: str,
    env: Mapping[str, str],
    count: int,
    timeout_s: float = 60.0,
    give_up: Callable[[], str | None] | None = None,
) -> frozenset[str]:
    """The ids of the cluster's alive nodes once there are ``count`` of them. ``give_up`` (polled every half second)
    says why waiting on is pointless (e.g. a node's ``ray start`` exited), which ends the wait at once."""
    script = (
        "import sys, time, ray\n"
        "ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "deadline = time.monotonic() + float(sys.argv[3])\n"
        "while time.monotonic() < deadline:\n"
        "    nodes = ray.nodes()\n"
        "    alive = [n['NodeID'] for n in nodes if n['Alive']]\n"
        "    if len(alive) == int(sys.argv[2]):\n"
        "        print('NODES', ' '.join(alive)); break\n"
        "    time.sleep(0.5)\n"
        "else:\n"
        "    print(f'after {sys.argv[3]} s the GCS knows {len(nodes)} node(s):')\n"
        "    for n in nodes:\n"
        "        print('  ', n['NodeManagerAddress'], 'alive' if n['Alive'] else 'dead', n['NodeID'][:12])\n"
    )
    probe = subprocess.Popen(
        [sys.executable, "-c", script, address, str(count), str(timeout_s)],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + timeout_s + 60
    reason = None
    while probe.poll() is None and time.monotonic() < deadline:
        reason = give_up() if give_up is not None else None
        if reason is not None:
            break
        time.sleep(0.5)
    if probe.poll() is None:
        probe.kill()
    stdout, stderr = probe.communicate()
    match = re.search(r"^NODES (.+)$", stdout, re.MULTILINE)
    if match is None:
        why = f" ({reason})" if reason else ""
        raise RuntimeError(f"the cluster did not reach {count} nodes{why}:\n{stdout}\n{stderr}")
    return frozenset(match.group(1).split())


def raylet_of(node: subprocess.Popen[bytes], timeout_s: float = 30.0) -> psutil.Process:
    """The raylet that ``node`` (a ``ray start --block`` process) spawned."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [c for c in psutil.Process(node.pid).children(recursive=True) if c.name() == "raylet"]
        if found:
            return found[0]
        time.sleep(0.2)
    raise RuntimeError(f"no raylet under ray start pid {node.pid}")
