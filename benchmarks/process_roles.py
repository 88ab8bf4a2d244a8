"""The processes of a run by role (driver, client hosts, shards, each of Ray's own), their CPU and their PSS.

Used by ``scale.py``: every process under the benchmark's own (the driver) is named by what its command line says
it is, so that Ray's processes (GCS, raylet, dashboard API server and agent, runtime-env agent, log monitor,
autoscaler monitor, idle workers) are told apart from rayfl's actors.
"""

from __future__ import annotations

import os
import threading
import time

import psutil

__all__ = ["PssSampler", "cpu_by_role", "host_thread_cpu", "role_of"]

ROLES = (
    ("ClientHost", "client_host"),
    ("ParamServerShard", "param_shard"),
    ("raylet", "raylet"),
    ("gcs_server", "gcs"),
    ("dashboard", "dashboard"),
    ("DashboardAgent", "dashboard"),
    ("RuntimeEnvAgent", "runtime_env_agent"),
    ("log_monitor", "log_monitor"),
    ("runtime_env", "runtime_env_agent"),
    ("monitor.py", "monitor"),
    ("ray::IDLE", "idle_worker"),
    ("default_worker", "idle_worker"),
)


def role_of(proc: psutil.Process, root: int) -> str:
    if proc.pid == root:
        return "driver"
    try:
        text = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "other"
    for needle, role in ROLES:
        if needle in text:
            return role
    return "other"


def _tree() -> tuple[int, list[psutil.Process]]:
    root = psutil.Process(os.getpid())
    return root.pid, [root, *root.children(recursive=True)]


def cpu_by_role() -> dict[str, float]:
    """CPU seconds (user + system) used so far by the live processes of each role."""
    root, procs = _tree()
    total: dict[str, float] = {}
    for proc in procs:
        try:
            role = role_of(proc, root)
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total[role] = total.get(role, 0.0) + times.user + times.system
    return total


def host_thread_cpu() -> tuple[float, float]:
    """CPU seconds so far of the client hosts' main threads (where clients train) and of their other threads (Ray's
    core worker: gRPC polling, the object store's client, the event loop)."""
    root, procs = _tree()
    main = other = 0.0
    for proc in procs:
        try:
            if role_of(proc, root) != "client_host":
                continue
            for thread in proc.threads():
                spent = thread.user_time + thread.system_time
                if thread.id == proc.pid:
                    main += spent
                else:
                    other += spent
        except psutil.Error:
            continue
    return main, other


class PssSampler(threading.Thread):
    """Peak PSS (MiB) per role and of the whole tree under the current process, sampled every ``period_s`` or less
    often: reading one process's PSS makes the kernel walk its page tables (about 30 ms for a torch process), so the
    wait after a sample is at least ``1 / max_share - 1`` times what it took, and the sampler uses at most
    ``max_share`` of one core (at 0.2 s flat it used most of a core, which a 2-core machine's start-up felt).

    ``pause`` stops the periodic samples (``sample`` still takes one when called): ``scale.py`` pauses it over the
    steady rounds it times, whose memory it samples at their start and end instead, so that the sampler's CPU is not
    taken from the client hosts' cores while their rate and CPU share are measured."""

    def __init__(self, period_s: float = 0.2, max_share: float = 0.15) -> None:
        super().__init__(daemon=True)
        self.period_s = period_s
        self.max_share = max_share
        self.peak_by_role: dict[str, float] = {}
        self.count_by_role: dict[str, int] = {}
        self.peak_total = 0.0
        self.own_cpu_s = 0.0  # the sampler's own CPU seconds, left out of the driver's (``cpu_by_role``)
        self.last_by_role: dict[str, float] = {}  # PSS per role at the last sample (the end of the run)
        self._halt = threading.Event()
        self._paused = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> None:
        began = time.thread_time()
        root, procs = _tree()
        by_role: dict[str, float] = {}
        counts: dict[str, int] = {}
        for proc in procs:
            try:
                pss = proc.memory_full_info().pss / 2**20
            except psutil.Error:
                continue
            role = role_of(proc, root)
            by_role[role] = by_role.get(role, 0.0) + pss
            counts[role] = counts.get(role, 0) + 1
        with self._lock:
            self.last_by_role = by_role
            for role, pss in by_role.items():
                self.peak_by_role[role] = max(self.peak_by_role.get(role, 0.0), pss)
                self.count_by_role[role] = max(self.count_by_role.get(role, 0), counts[role])
            self.peak_total = max(self.peak_total, sum(by_role.values()))
            self.own_cpu_s += time.thread_time() - began

    def cpu_by_role(self) -> dict[str, float]:
        """``cpu_by_role()`` with the sampler's own CPU left out of the driver's."""
        total = cpu_by_role()
        with self._lock:
            total["driver"] = total.get("driver", 0.0) - self.own_cpu_s
        return total

    def pause(self) -> None:
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def run(self) -> None:
        while not self._halt.is_set():
            began = time.perf_counter()
            if not self._paused.is_set():
                self.sample()
            took = time.perf_counter() - began
            self._halt.wait(max(self.period_s, took * (1 / self.max_share - 1)))

    def stop(self) -> None:
        self._halt.set()
        self.join()
