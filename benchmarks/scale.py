"""Scale benchmark: updates/s, end-to-end wall, start-up breakdown, CPU and memory (PSS) per process.

Workload per point (the issue's FedAvg workload): ``N`` synthetic clients with 64 3x32x32 images each, ``K`` clients
per round, one epoch of batch 32 SGD on a two-conv CNN, or no training at all with ``--noop`` (``train.noop``: the
engine alone). Each point runs in a fresh Python process (so Ray starts cold and memory is the point's own), started
the way ``rayfl run`` starts, and reports

* the start-up breakdown. On Ray, ``prestart_*`` (``ray_session.prestart``): ``prestart_ray_start_s`` (``ray.init``
  in the main thread) beside ``prestart_import_s`` (the driver's modules: torch, rayfl) then ``prestart_load_s``
  (the data set) in a second thread, and ``prestart_pool_s`` (creating the actors once Ray is up: they start and
  import while the data loads); then the run's own (``RunResult.startup_s``): ``setup_s`` (algorithm and initial
  model; with the local backend the data too), ``put_s`` (the data set into the object store), ``backend_s`` (waiting
  for the hosts to be built from the run's references), ``first_round_s``. ``imports_s`` is what was imported before
  (all of rayfl and torch with the local backend). ``end_to_end_s`` is the process-internal wall of the whole run,
  ``steady_updates_per_s`` the rate of the rounds after the first (evaluation excluded by ``eval_every``); with
  ``--repeat 2`` the same run again in the same process on the first run's warm actors (``backend.keep_warm``)
  under ``again``;
* ``startup_cpu_s``: the CPU seconds every process role used from its start to the end of the first round (the
  driver without this benchmark's own sampler): a load-independent profile of the cold start;
* ``steady_host_cpu_share`` (Ray): the client hosts' CPU seconds over the steady rounds divided by wall seconds
  times hosts, i.e. how much of their cores they got; on a busy machine it explains a low rate without any
  profile of the engine; ``host_cpu_ms_per_update``: the hosts' CPU per client update over those rounds
  (``--reference`` adds the bare single-thread training loop's rate and ``loop_cpu_ms_per_update``, timed in this
  process: the two CPU figures compare the engine's per-client cost with the bare loop's whatever the load);
* ``peak_pss_mib`` / ``end_pss_mib``: the proportional set size of each process role (the driver and every
  descendant: Ray's GCS, raylet, agents, workers, client hosts, shards), its peak over samples (at most 15% of a
  core's worth) and at the end of the last round, and ``peak_pss_total_mib`` the tree's peak.

With ``--backend ray local`` each point runs on both, and the table ends with the measured cross-over: the number of
client updates beyond which Ray's faster rounds repay its slower start, ``(start_ray - start_local) / (1 / rate_local
- 1 / rate_ray)``, where a backend's start is its end-to-end wall minus its rounds.

Run everything: ``python benchmarks/scale.py --out scale.json`` (prints a markdown table). Subsets:
``--n 100 1000 --k 10 --mode noop train --backend ray local --rounds 3 --hosts 2``. Combinations with ``K > N`` are
skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

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


def _role(proc: psutil.Process, root: int) -> str:
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


class PssSampler(threading.Thread):
    """Peak PSS (MiB) per role and of the whole tree under the current process, sampled every ``period_s`` or less
    often: reading one process's PSS makes the kernel walk its page tables (about 30 ms for a torch process), so the
    wait after a sample is at least ``1 / max_share - 1`` times what it took, and the sampler uses at most
    ``max_share`` of one core (at 0.2 s flat it used most of a core, which a 2-core machine's start-up felt)."""

    def __init__(self, period_s: float = 0.2, max_share: float = 0.15) -> None:
        super().__init__(daemon=True)
        self.period_s = period_s
        self.max_share = max_share
        self.peak_by_role: dict[str, float] = {}
        self.count_by_role: dict[str, int] = {}
        self.peak_total = 0.0
        self.own_cpu_s = 0.0  # the sampler thread's own CPU seconds, left out of the driver's (``cpu_by_role``)
        self.last_by_role: dict[str, float] = {}  # PSS per role at the last sample (the end of the run)
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> None:
        began = time.thread_time()
        root = psutil.Process(os.getpid())
        by_role: dict[str, float] = {}
        counts: dict[str, int] = {}
        for proc in [root, *root.children(recursive=True)]:
            try:
                pss = proc.memory_full_info().pss / 2**20
            except psutil.Error:
                continue
            role = _role(proc, root.pid)
            by_role[role] = by_role.get(role, 0.0) + pss
            counts[role] = counts.get(role, 0) + 1
        with self._lock:
            self.last_by_role = by_role
            for role, pss in by_role.items():
                self.peak_by_role[role] = max(self.peak_by_role.get(role, 0.0), pss)
                self.count_by_role[role] = max(self.count_by_role.get(role, 0), counts[role])
            self.peak_total = max(self.peak_total, sum(by_role.values()))
            self.own_cpu_s += time.thread_time() - began

    def cpu_s(self, role: str) -> float:
        """CPU seconds (user + system) used so far by the live processes of ``role``."""
        return self.cpu_by_role().get(role, 0.0)

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far by the live processes of each role."""
        root = psutil.Process(os.getpid())
        total: dict[str, float] = {}
        for proc in [root, *root.children(recursive=True)]:
            try:
                role = _role(proc, root.pid)
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total[role] = total.get(role, 0.0) + times.user + times.system
        with self._lock:
            total["driver"] = total.get("driver", 0.0) - self.own_cpu_s
        return total

    def run(self) -> None:
        while not self._halt.is_set():
            began = time.perf_counter()
            self.sample()
            took = time.perf_counter() - began
            self._halt.wait(max(self.period_s, took * (1 / self.max_share - 1)))

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_point(
    n: int, k: int, noop: bool, backend: str, rounds: int, hosts: int, repeat: int = 1, reference: bool = False
) -> dict[str, Any]:
    """One point, in this process, started the way ``rayfl run`` starts (Ray's start overlapping the driver's
    imports); with ``repeat`` > 1 the same run again in the same process, on the first run's warm actors
    (``backend.keep_warm``), reported under ``again``; with ``reference`` (training only) the bare training loop timed
    right after, in this process (``engine_overhead.pure_compute_s``), and the ratio of the steady rate to ``hosts``
    such loops: a figure that load on the machine inflates on both sides alike."""
    began = time.perf_counter()
    sampler = PssSampler()
    sampler.start()
    from rayfl.config import BackendConfig, CNNConfig, DataConfig, ExperimentConfig, FedAvgConfig, TrainConfig
    from rayfl.engine.ray_session import prestart, shutdown_ray

    cfg = ExperimentConfig(
        name="scale",
        rounds=rounds,
        clients_per_round=k,
        eval_every=10_000,  # only the last round is evaluated
        data=DataConfig(name="synthetic", partition="iid", num_clients=n, synthetic_samples=64),
        model=CNNConfig(channels=(16, 32)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=32, lr=0.05, optimizer="sgd", noop=noop),
        backend=BackendConfig(
            kind=backend,  # type: ignore[arg-type]
            num_hosts=hosts,
            num_cpus=hosts,
            keep_warm=repeat > 1,
        ),
    )
    early: dict[str, float] = {}
    data = []
    if backend == "ray":  # as ``rayfl run``: Ray starts while the driver's modules are imported and the data loaded
        t0 = time.perf_counter()
        started = prestart(cfg, ("rayfl.engine.driver",))
        data.append(started.dataset)
        early = {"prestart_s": time.perf_counter() - t0, **{f"prestart_{k}": v for k, v in started.startup_s.items()}}
        del started
    from rayfl.engine.driver import run_experiment

    imports_s = time.perf_counter() - began - early.get("prestart_s", 0.0)
    # the hosts' CPU over the steady rounds (after the first, before the evaluated last): how much of ``hosts`` cores
    # they got, which tells a busy machine (share well below 1) from engine overhead (share near 1, rate low)
    marks: dict[int, tuple[float, float]] = {}
    last_steady = rounds - 2 if rounds > 2 else rounds - 1
    startup_cpu: dict[str, float] = {}
    end_pss: dict[str, float] = {}

    sampled_s = [0.0]

    def mark(record: Any) -> None:
        if record.round_idx == 0:  # every process's CPU seconds since it started: the cold start's CPU by role
            startup_cpu.update(sampler.cpu_by_role())
        if record.round_idx in (0, last_steady):
            marks[record.round_idx] = (time.perf_counter(), sampler.cpu_s("client_host"))
        if record.round_idx == rounds - 1:  # every process at the end of the run, before the actors go
            t0 = time.perf_counter()
            sampler.sample()
            end_pss.update(sampler.last_by_role)
            sampled_s[0] = time.perf_counter() - t0  # left out of end_to_end_s

    result = run_experiment(cfg, write=False, callbacks=[mark], dataset=data.pop() if data else None)
    end_to_end_s = time.perf_counter() - began - sampled_s[0]
    host_share: dict[str, float] = {}
    if backend == "ray" and 0 in marks and last_steady in marks and last_steady > 0:
        (t0, c0), (t1, c1) = marks[0], marks[last_steady]
        host_share = {
            "steady_host_cpu_share": (c1 - c0) / ((t1 - t0) * hosts),
            # CPU per client update in the hosts: beside loop_cpu_ms_per_update, the engine's own cost per client
            # on the hosts, whatever the machine's load
            "host_cpu_ms_per_update": 1000 * (c1 - c0) / (k * (last_steady)),
        }
    again: dict[str, Any] = {}
    for _ in range(repeat - 1):
        t0 = time.perf_counter()
        second = run_experiment(cfg, write=False)
        again = {"end_to_end_s": time.perf_counter() - t0, **_startup(second)}
    sampler.stop()
    shutdown_ray()
    walls = [r.round_wall_s for r in result.records]
    steady = walls[1:-1] if len(walls) > 2 else walls[1:]
    steady_rate = k * len(steady) / sum(steady) if steady and sum(steady) > 0 else float("nan")
    loops: dict[str, float] = {}
    if reference and not noop:
        from engine_overhead import pure_compute_s  # this folder is on sys.path when run as a script

        loop_rate = 2 * k / pure_compute_s(cfg, 2)
        loop_cpu_ms = 1000 * pure_compute_s(cfg, 2, clock=time.process_time) / (2 * k)
        loops = {
            "one_loop_updates_per_s": loop_rate,
            "ratio_to_loops": steady_rate / (hosts * loop_rate),
            "loop_cpu_ms_per_update": loop_cpu_ms,
        }
    return {
        "n": n,
        "k": k,
        "mode": "noop" if noop else "train",
        "backend": backend,
        "hosts": hosts,
        "rounds": rounds,
        "imports_s": imports_s,
        **_startup(result),
        **early,
        "steady_updates_per_s": steady_rate,
        **loops,
        **host_share,
        "end_to_end_s": end_to_end_s,
        "start_s": end_to_end_s - sum(walls),  # everything but the rounds: imports, Ray, data, actors, close
        "again": again,
        "startup_cpu_s": {role: round(v, 2) for role, v in sorted(startup_cpu.items())},
        "peak_pss_mib": {role: round(v, 1) for role, v in sorted(sampler.peak_by_role.items())},
        "end_pss_mib": {role: round(v, 1) for role, v in sorted(end_pss.items())},
        "processes": dict(sorted(sampler.count_by_role.items())),
        "peak_pss_total_mib": round(sampler.peak_total, 1),
    }


def _startup(result: Any) -> dict[str, float]:
    """The start-up breakdown of a run: Ray start (overlapping the set-up: data, algorithm, model), the data's put,
    the actors' start, and the first round."""
    keys = ("ray_start_s", "setup_s", "pool_s", "put_s", "backend_s")
    out = {key: float(result.startup_s.get(key, 0.0)) for key in keys}
    out["first_round_s"] = result.records[0].round_wall_s
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| N | K | mode | backend | updates/s (steady) | end to end s | imports s | Ray start s | beside it: driver "
        "imports s, data s | set-up s | actors ready s | first round s | again (warm actors): end to end s | start-up "
        "CPU s (by role) | peak PSS MiB | PSS by role at the end MiB |\n|" + " --- |" * 16
    )
    lines = [head]
    for r in rows:
        roles = ", ".join(f"{k} {v:.0f}" for k, v in r["end_pss_mib"].items())
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in r["startup_cpu_s"].items() if v >= 0.05)
        again = f"{r['again']['end_to_end_s']:.1f}" if r.get("again") else ""
        ratio = f" ({r['ratio_to_loops']:.2f} x {r['hosts']} loops)" if "ratio_to_loops" in r else ""
        if "steady_host_cpu_share" in r:
            ratio += f" [hosts had {r['steady_host_cpu_share']:.2f} of their cores"
            ratio += f", {r['host_cpu_ms_per_update']:.1f} CPU ms/update"
            ratio += f" vs {r['loop_cpu_ms_per_update']:.1f} bare]" if "loop_cpu_ms_per_update" in r else "]"
        beside = f"{r['prestart_import_s']:.2f}, {r['prestart_load_s']:.2f}" if "prestart_s" in r else ""
        lines.append(
            f"| {r['n']} | {r['k']} | {r['mode']} | {r['backend']} | {r['steady_updates_per_s']:.1f}{ratio} | "
            f"{r['end_to_end_s']:.1f} | {r['imports_s']:.2f} | {r.get('prestart_ray_start_s', 0.0):.2f} | {beside} | "
            f"{r['setup_s']:.2f} | {r['backend_s']:.2f} | {r['first_round_s']:.2f} | {again} | "
            f"{sum(r['startup_cpu_s'].values()):.1f} ({cpu}) | {r['peak_pss_total_mib']:.0f} | {roles} |"
        )
    lines.extend(crossovers(rows))
    return "\n".join(lines)


def crossovers(rows: list[dict[str, Any]]) -> list[str]:
    """For each point measured on both backends: the client updates beyond which Ray is faster end to end."""
    out = []
    by_point = {(r["n"], r["k"], r["mode"], r["backend"]): r for r in rows}
    for (n, k, mode, backend), ray_row in by_point.items():
        local_row = by_point.get((n, k, mode, "local"))
        if backend != "ray" or local_row is None:
            continue
        start_ray, start_local = ray_row["start_s"], local_row["start_s"]
        rate_ray, rate_local = ray_row["steady_updates_per_s"], local_row["steady_updates_per_s"]
        text = f"\nN={n} K={k} {mode}: start {start_ray:.1f} s on Ray vs {start_local:.1f} s local, "
        text += f"{rate_ray:.1f} vs {rate_local:.1f} updates/s: "
        if rate_ray > rate_local:
            updates = (start_ray - start_local) / (1 / rate_local - 1 / rate_ray)
            text += f"Ray pays off beyond {updates:,.0f} client updates ({updates / k:,.0f} rounds of {k})"
        else:
            text += "Ray is not faster per round here (a busy machine, or no training to spread)"
        out.append(text)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000, 10_000])
    parser.add_argument("--k", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--mode", choices=["train", "noop"], nargs="+", default=["train", "noop"])
    parser.add_argument("--backend", choices=["ray", "local"], nargs="+", default=["ray"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="runs per point in one process (2: Ray reused)")
    parser.add_argument("--reference", action="store_true", help="time the bare training loop too (see run_point)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the rows (default: print only)")
    parser.add_argument("--point", action="store_true", help=argparse.SUPPRESS)  # internal: one point, JSON out
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.point:
        noop = args.mode[0] == "noop"
        row = run_point(
            args.n[0], args.k[0], noop, args.backend[0], args.rounds, args.hosts, args.repeat, args.reference
        )
        print("SCALE-ROW " + json.dumps(row))
        return
    rows: list[dict[str, Any]] = []
    for n in args.n:
        for k in args.k:
            if k > n:
                continue
            for mode in args.mode:
                for backend in args.backend:
                    cmd = [sys.executable, __file__, "--point", "--n", str(n), "--k", str(k), "--mode", mode]
                    cmd += ["--backend", backend, "--rounds", str(args.rounds), "--hosts", str(args.hosts)]
                    cmd += ["--repeat", str(args.repeat)] + (["--reference"] if args.reference else [])
                    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
                    found = [ln for ln in out.stdout.splitlines() if ln.startswith("SCALE-ROW ")]
                    if out.returncode != 0 or not found:
                        sys.stderr.write(out.stderr[-4000:])
                        raise SystemExit(f"point N={n} K={k} {mode} {backend} failed (exit {out.returncode})")
                    rows.append(json.loads(found[-1].removeprefix("SCALE-ROW ")))
                    rate = rows[-1]["steady_updates_per_s"]
                    sys.stderr.write(f"done N={n} K={k} {mode} {backend}: {rate:.1f} updates/s\n")
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    sys.stdout.write(markdown(rows) + "\n")


if __name__ == "__main__":
    main()
