"""A multi-node Ray cluster emulated on this machine (issue 32, build 1): a head and N worker nodes, each worker with
its own network address and its own disk, so that what differs on a real cluster (node IPs, head-local paths, a
job's working directory) is exercised by tests.

* **Network.** One Linux bridge per cluster carries a private /24 (``10.96-127.x.0/24``, picked unused): the head
  runs in this machine's network namespace on the bridge's address ``.1``; worker *i* runs in a network namespace of
  its own, joined to the bridge by a veth pair, at ``.(i+2)``. Ray therefore sees distinct node IPs. Only loopback and
  these addresses are used.
* **Disk.** Each worker also has a mount namespace of its own: a private temp folder (a folder under the cluster's
  root, bind-mounted over the machine's temp folder ``NODE_TMP``) that holds its working directory (``NODE_WORK``),
  ``HOME`` and Ray session folder. The head and the test share this machine's temp folder, and the cluster's root
  lives there, so whatever the head writes under it (a pytest ``tmp_path`` included) is invisible to the workers, as
  a head's local disk is.
* **Shared storage.** ``shared_dir`` (under the root) is bind-mounted at the same path into the workers named by
  ``shared_on`` (all by default), as an NFS mount would be; on the others that path does not exist.

Started by :func:`emulated_cluster` (a context manager; the ``emulated_cluster`` fixture in ``tests/conftest.py``
wraps it), which is bounded in time and removes every process, namespace, veth and bridge it made even when start-up
fails. Processes are ended by SIGTERM to our own ``ray start`` PIDs, then SIGKILL to whatever is left in each worker's
namespace (``ip netns pids``) or names the head's private temp root; never ``ray stop``. Where namespaces cannot be
made (not root, no ``ip``/``unshare``), :func:`unavailable` says why in one line and the fixture skips. A cluster
whose test process was SIGKILLed (no teardown) is removed by the next start (``remove_stale``: worker namespaces are
named ``rayfl-ec<tag>-p<owner pid>-w<i>``, and only those whose owner is gone are touched).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.local_cluster import BIN, OBJECT_STORE_BYTES, cluster_env, free_port, processes_of, stop, wait_for_nodes

# the machine's temp folder: the head's and the test's, and where each worker mounts its private one (so a worker's
# working directory and HOME sit at the same paths as on every other node)
NODE_TMP = Path(tempfile.gettempdir()).resolve()
REPO_ROOT = Path(__file__).resolve().parents[1]
NODE_WORK = NODE_TMP / "work"

START_TIMEOUT_S = 240.0  # three `ray start`s on a loaded 2-core box took 55-150 s
STOP_TIMEOUT_S = 20.0


@dataclass
class WorkerNode:
    """One emulated worker: its namespaces, address and private ``/tmp`` (``private_tmp`` is that folder as the head
    and the test see it)."""

    index: int
    netns: str
    ip: str
    private_tmp: Path
    shared: bool
    proc: subprocess.Popen[bytes] | None = None

    def pids(self) -> list[int]:
        """Every process in this node's network namespace (its raylet, workers, agents)."""
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True, check=False)
        return [int(p) for p in out.stdout.split()]

    def anchor_pid(self) -> int:
        """A process inside both of this node's namespaces (its ``ray start``), for ``nsenter``."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.index} is not running")
        return self.proc.pid

    def kill(self) -> None:
        """The node is lost: SIGKILL to every process in its namespace (a pre-empted machine)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=STOP_TIMEOUT_S)


@dataclass
class EmulatedCluster:
    """A running emulated cluster. ``address`` is the head's GCS (``ip:port``) for ``ray.init``/``backend.address``;
    ``env`` the environment to run drivers and ``ray`` commands with; ``shared_dir`` the storage mounted into the
    workers in ``shared_on``; ``head_ip`` and the workers' ``ip`` are distinct."""

    root: Path
    head_ip: str
    address: str
    env: dict[str, str]
    shared_dir: Path
    workers: list[WorkerNode]
    bridge: str
    node_ids: frozenset[str] = frozenset()
    dashboard: str = ""  # http://head_ip:port when started with dashboard=True
    visible: tuple[Path, ...] = ()  # folders under NODE_TMP every worker also sees, at the same path
    head_proc: subprocess.Popen[bytes] | None = None
    _extra: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run_on(
        self, worker: int, argv: Sequence[str], *, timeout_s: float = 60.0, cwd: str = str(NODE_WORK)
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside worker ``worker``'s network and mount namespaces (it sees that node's disk)."""
        node = self.workers[worker]
        return subprocess.run(
            # --wd alone: the node's own working directory (a path given to nsenter is opened outside the namespace)
            [
                "nsenter",
                "-t",
                str(node.anchor_pid()),
                "-n",
                "-m",
                "--wd",
                "--",
                "sh",
                "-c",
                'cd "$0" && exec "$@"',
                cwd,
                *argv,
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def kill_worker(self, worker: int) -> None:
        """Lose worker ``worker`` (every process in its namespace SIGKILLed); the others go on."""
        self.workers[worker].kill()


def unavailable() -> str | None:
    """Why namespaces cannot be made here (one line), or None when they can."""
    if sys.platform != "linux":
        return "the emulated cluster needs Linux namespaces"
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"the emulated cluster needs `{tool}` on PATH"
    probe = f"rayfl-probe-{os.getpid()}-{random.randrange(1 << 24):06x}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip() or made.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {out.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.96.0.0/11 that no address or route on this machine overlaps (random, so that concurrent
    clusters, e.g. xdist workers, pick different ones; ``ip addr add`` of a taken one fails loudly)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
    taken: list[ipaddress.IPv4Network] = []
    for line in used.splitlines():
        parts = line.split()
        if "inet" in parts:
            taken.append(ipaddress.ip_network(parts[parts.index("inet") + 1], strict=False))
    for line in routes.splitlines():
        head = line.split()[0]
        if head != "default":
            taken.append(ipaddress.ip_network(head if "/" in head else f"{head}/32", strict=False))
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{rng.randrange(96, 128)}.{rng.randrange(256)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError("no free 10.96.0.0/11 subnet for the emulated cluster")


_WORKER_SCRIPT = """set -e
mount --make-rprivate /
if [ -n "$EC_SHARED" ]; then mount --bind "$EC_SHARED" "$EC_TMP$EC_SHARED_REL"; fi
printf '%s\\n' "$EC_MACHINE" | while IFS= read -r p; do
  if [ -n "$p" ]; then mount --bind "$p" "$EC_TMP${p#"$EC_NODE_TMP"}"; fi
done
mount --rbind "$EC_TMP" "$EC_NODE_TMP"
cd "$EC_NODE_TMP/work"
export HOME="$EC_NODE_TMP/home" TMPDIR="$EC_NODE_TMP"
exec "$@"
"""


def machine_paths_under_node_tmp() -> list[Path]:
    """What every node must see of this machine but that lives under ``NODE_TMP``, which a worker's private temp
    folder hides: the repository (rayfl is installed from it in editable mode), the Python environment that runs
    ``ray`` and its base installation. A checkout under the temp folder (a CI clone in ``/tmp``) otherwise leaves the
    workers without ``ray`` ("exec: .../bin/ray: not found"), and the cluster never reaches its node count."""
    needed = {REPO_ROOT, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}  # `ray` is in sys.prefix
    under = sorted(p for p in needed if p != NODE_TMP and p.is_relative_to(NODE_TMP))
    # the outermost of nested paths carries the rest
    return [p for p in under if not any(q != p and p.is_relative_to(q) for q in under)]


def _start_worker(cluster: EmulatedCluster, node: WorkerNode, cpus: float, resources: str | None) -> None:
    (node.private_tmp / "work").mkdir(parents=True)
    (node.private_tmp / "home").mkdir()
    visible = [*machine_paths_under_node_tmp(), *cluster.visible]
    for path in visible:
        (node.private_tmp / path.relative_to(NODE_TMP)).mkdir(parents=True, exist_ok=True)
    env = dict(
        cluster.env,
        EC_TMP=str(node.private_tmp),
        EC_NODE_TMP=str(NODE_TMP),
        EC_SHARED="",
        EC_SHARED_REL="",
        EC_MACHINE="\n".join(str(p) for p in visible),
    )
    if node.shared:
        rel = cluster.shared_dir.relative_to(NODE_TMP)
        (node.private_tmp / rel).mkdir(parents=True)
        env.update(EC_SHARED=str(cluster.shared_dir), EC_SHARED_REL=f"/{rel}")
    ray_args = [
        str(BIN / "ray"),
        "start",
        f"--address={cluster.address}",
        f"--node-ip-address={node.ip}",
        f"--temp-dir={NODE_TMP / f'ray_w{node.index}'}",
        f"--num-cpus={cpus:g}",
        "--num-gpus=0",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        "--block",
    ]
    if resources:
        ray_args.append(f"--resources={resources}")
    node.proc = subprocess.Popen(
        ["ip", "netns", "exec", node.netns, "unshare", "--mount", "--", "sh", "-c", _WORKER_SCRIPT, "sh", *ray_args],
        env=env,
        stdout=open(cluster.root / f"w{node.index}.log", "wb"),  # noqa: SIM115 - owned by the process
        stderr=subprocess.STDOUT,
    )


@contextlib.contextmanager
def emulated_cluster(
    workers: int = 2,
    *,
    worker_cpus: float = 1,
    head_cpus: float = 0,
    shared_on: Sequence[int] | None = None,
    worker_resources: str | None = None,
    dashboard: bool = False,
    system_config: Mapping[str, object] | None = None,
    visible: Sequence[Path] = (),
) -> Iterator[EmulatedCluster]:
    """Start a head (``head_cpus``, default 0: reserved for the driver and GCS) and ``workers`` worker nodes of
    ``worker_cpus`` each; ``shared_on`` lists the workers that mount ``shared_dir`` (None: all of them); with
    ``dashboard`` the head serves Ray's dashboard and job API at ``cluster.dashboard`` (``ray job submit --address``);
    ``system_config`` goes to the head's ``--system-config`` (e.g. faster health checks for node-loss tests);
    ``visible`` names folders under ``NODE_TMP`` that the workers see as well (as this machine's own paths that a
    node also has; the repository and the Python environment are always visible, see
    ``machine_paths_under_node_tmp``). Raises RuntimeError if the cluster does not come up within
    ``START_TIMEOUT_S``, with each node's ``ray start`` output and log tails (``start_report``)."""
    remove_stale()
    tag = f"{random.Random(os.getpid() ^ time.monotonic_ns()).randrange(1 << 20):05x}"
    root = Path(tempfile.mkdtemp(prefix=f"rfec{tag}_", dir=NODE_TMP))  # short: Ray's socket paths live under it
    shared_dir = root / "shared"
    shared_dir.mkdir()
    net = _free_subnet()
    hosts = list(net.hosts())
    head_ip = str(hosts[0])
    env = cluster_env()
    port = free_port()
    address = f"{head_ip}:{port}"
    mounted = set(range(workers) if shared_on is None else shared_on)
    cluster = EmulatedCluster(
        root=root,
        head_ip=head_ip,
        address=address,
        env=env,
        shared_dir=shared_dir,
        workers=[
            WorkerNode(i, f"rayfl-ec{tag}-p{os.getpid()}-w{i}", str(hosts[i + 1]), root / f"w{i}" / "tmp", i in mounted)
            for i in range(workers)
        ],
        bridge=f"rfb{tag}",
        visible=tuple(Path(v) for v in visible),
    )
    made_bridge = False
    made_netns: list[str] = []
    head_dashboard = ["--include-dashboard=false"]
    if dashboard:
        dashboard_port = free_port()
        cluster.dashboard = f"http://{head_ip}:{dashboard_port}"
        head_dashboard = [
            "--include-dashboard=true",
            f"--dashboard-host={head_ip}",
            f"--dashboard-port={dashboard_port}",
            # the job API's agent listens on this machine's namespace: Ray's default port (52365) is taken by any
            # other Ray started here (another test's ray.init), and then no job can be submitted ("No available
            # agent to submit job")
            f"--dashboard-agent-listen-port={free_port()}",
        ]
    try:
        _ip("link", "add", cluster.bridge, "type", "bridge")
        made_bridge = True
        _ip("addr", "add", f"{head_ip}/{net.prefixlen}", "dev", cluster.bridge)
        _ip("link", "set", cluster.bridge, "up")
        for node in cluster.workers:
            _ip("netns", "add", node.netns)
            made_netns.append(node.netns)
            outside, inside = f"rf{tag}h{node.index}", f"rf{tag}n{node.index}"
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", node.netns)
            _ip("link", "set", outside, "master", cluster.bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", node.netns, "addr", "add", f"{node.ip}/{net.prefixlen}", "dev", inside)
            _ip("-n", node.netns, "link", "set", inside, "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
        cluster.head_proc = subprocess.Popen(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                f"--port={port}",
                f"--node-ip-address={head_ip}",
                *head_dashboard,
                *([f"--system-config={json.dumps(dict(system_config))}"] if system_config else []),
                f"--temp-dir={root}/head",
                f"--num-cpus={head_cpus:g}",
                "--num-gpus=0",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                "--block",
            ],
            env=env,
            stdout=open(root / "head.log", "wb"),  # noqa: SIM115 - owned by the process
            stderr=subprocess.STDOUT,
        )
        for node in cluster.workers:
            _start_worker(cluster, node, worker_cpus, worker_resources)
        try:
            cluster.node_ids = wait_for_nodes(
                address, env, workers + 1, timeout_s=START_TIMEOUT_S, give_up=lambda: _exited(cluster)
            )
        except RuntimeError as err:
            raise RuntimeError(f"{err}\n{start_report(cluster)}") from None
        yield cluster
    finally:
        _teardown(cluster, made_bridge, made_netns)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # ray start colours its output


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as err:
        return f"    ({path.name}: {err.strerror})"
    return "\n".join(f"    {_ANSI.sub('', line)}" for line in text[-lines:]) or "    (empty)"


def _state(proc: subprocess.Popen[bytes] | None) -> str:
    if proc is None:
        return "not started"
    code = proc.poll()
    return "running" if code is None else f"exited with {code}"


def _exited(cluster: EmulatedCluster) -> str | None:
    """Which node's ``ray start --block`` has ended (it never does while its node runs), if any."""
    for name, proc in [("head", cluster.head_proc), *((f"worker {n.index}", n.proc) for n in cluster.workers)]:
        if proc is not None and proc.poll() is not None:
            return f"the {name}'s `ray start` exited with {proc.returncode}"
    return None


def start_report(cluster: EmulatedCluster) -> str:
    """What each node did while the cluster came up, for a failure message that CI's output alone explains: each
    worker's ``ray start`` state and output and its raylet's log tails, then the head's (shorter: it is the node the
    probe reached)."""
    parts: list[str] = []
    for node in cluster.workers:
        name = f"worker {node.index} ({node.ip}, netns {node.netns})"
        log = cluster.root / f"w{node.index}.log"
        parts.append(f"--- {name}: `ray start` {_state(node.proc)}; its output:\n{_tail(log)}")
        logs = node.private_tmp / f"ray_w{node.index}" / "session_latest" / "logs"
        if not logs.exists():
            parts.append(f"--- {name}: no Ray session logs (the node's raylet never started)")
        for file in ("raylet.err", "raylet.out"):
            if (logs / file).exists():
                parts.append(f"--- {name}: {file}:\n{_tail(logs / file, 15)}")
    parts.append(f"--- head ({cluster.head_ip}): `ray start` {_state(cluster.head_proc)}; its output:")
    parts.append(_tail(cluster.root / "head.log", 8))
    logs = cluster.root / "head" / "session_latest" / "logs"
    for file in ("gcs_server.err", "raylet.err"):
        if (logs / file).exists():
            parts.append(f"--- head: {file}:\n{_tail(logs / file, 10)}")
    return "\n".join(parts)


def _teardown(cluster: EmulatedCluster, made_bridge: bool, made_netns: list[str]) -> None:
    for node in cluster.workers:
        if node.proc is not None:
            stop(node.proc, timeout_s=STOP_TIMEOUT_S)
    for node in cluster.workers:
        if node.netns in made_netns:
            deadline = time.monotonic() + 5
            while node.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            node.kill()  # ours: every process in a namespace this cluster made
    if cluster.head_proc is not None:
        stop(cluster.head_proc, timeout_s=STOP_TIMEOUT_S)
    deadline = time.monotonic() + 10
    while processes_of(str(cluster.root)) and time.monotonic() < deadline:
        time.sleep(0.3)
    for proc in processes_of(str(cluster.root)):  # ours by the head's private temp root
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    for name in made_netns:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)  # takes its veth end along
    for node in cluster.workers:
        # ... but the kernel drops the pair asynchronously: delete this side too, so nothing outlives the teardown
        subprocess.run(["ip", "link", "del", f"rf{cluster.bridge[3:]}h{node.index}"], capture_output=True, check=False)
    if made_bridge:
        subprocess.run(["ip", "link", "del", cluster.bridge], capture_output=True, check=False)
    shutil.rmtree(cluster.root, ignore_errors=True)


_STALE = re.compile(r"^rayfl-ec([0-9a-f]{5})-p(\d+)-w\d+$")


def remove_stale() -> list[str]:
    """Namespaces (and their bridges and processes) of emulated clusters whose test process died without its
    teardown (SIGKILL): a namespace's name holds its owner's PID, so only clusters whose owner is gone are touched."""
    removed = []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        found = _STALE.match(name)
        if found is None or psutil.pid_exists(int(found.group(2))):
            continue
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False).stdout
        for pid in pids.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", f"rfb{found.group(1)}"], capture_output=True, check=False)
        removed.append(name)
    return removed


def leftovers(cluster: EmulatedCluster) -> list[str]:
    """What of ``cluster`` outlived its teardown: namespaces, links, processes, its root folder."""
    found: list[str] = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    found += [f"netns {n.netns}" for n in cluster.workers if n.netns in netns]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    tag = cluster.bridge[3:]
    found += [
        f"link {line.split(':')[1].strip()}"
        for line in links.splitlines()
        if f"rf{tag}" in line or cluster.bridge in line
    ]
    found += [f"process {p.pid}" for p in processes_of(str(cluster.root))]
    if cluster.root.exists():
        found.append(f"folder {cluster.root}")
    return found
