"""Scale benchmark: updates/s, end-to-end wall, start-up breakdown and peak memory (PSS) per process.

Workload per point (the issue's FedAvg workload): ``N`` synthetic clients with 64 3x32x32 images each, ``K`` clients
per round, one epoch of batch 32 SGD on a two-conv CNN, or no training at all with ``--noop`` (``train.noop``: the
engine alone). Each point runs in a fresh Python process (so Ray starts cold and memory is the point's own) and
reports

* the start-up breakdown (``RunResult.startup_s``): ``imports_s`` (rayfl, torch), ``ray_start_s`` (``ray.init``, 0
  for the local backend or a reused Ray) which overlaps ``setup_s`` (data, algorithm, initial model: built in a second
  thread meanwhile), ``put_s`` (the data set into the object store), ``backend_s`` (client hosts and parameter-server
  shards started and ready), ``first_round_s``; then ``steady_updates_per_s`` (rounds after the first, evaluation
  excluded by ``eval_every``) and ``end_to_end_s`` (process-internal wall of the whole run); with ``--repeat 2`` the
  same run again in the same process (Ray reused) under ``again``;
* ``steady_host_cpu_share`` (Ray): the client hosts' CPU seconds over the steady rounds divided by wall seconds
  times hosts, i.e. how much of their cores they got; on a busy machine it explains a low rate without any
  profile of the engine; ``host_cpu_ms_per_update``: the hosts' CPU per client update over those rounds
  (``--reference`` adds the bare single-thread training loop's rate and ``loop_cpu_ms_per_update``, timed in this
  process: the two CPU figures compare the engine's per-client cost with the bare loop's whatever the load);
* ``peak_pss_mib``: the peak, over samples every 0.2 s, of the proportional set size of each process of the tree
  (the driver and every descendant: Ray's GCS, raylet, workers, client hosts, shards), grouped by role, and of the
  tree's total.

Run everything: ``python benchmarks/scale.py --out scale.json`` (prints a markdown table). Subsets:
``--n 100 1000 --k 10 --mode noop train --backend ray --rounds 3 --hosts 2``. Combinations with ``K > N`` are
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
    """Peak PSS (MiB) per role and of the whole tree under the current process, sampled every ``period_s``."""

    def __init__(self, period_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.period_s = period_s
        self.peak_by_role: dict[str, float] = {}
        self.count_by_role: dict[str, int] = {}
        self.peak_total = 0.0
        self._halt = threading.Event()

    def sample(self) -> None:
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
        for role, pss in by_role.items():
            self.peak_by_role[role] = max(self.peak_by_role.get(role, 0.0), pss)
            self.count_by_role[role] = max(self.count_by_role.get(role, 0), counts[role])
        self.peak_total = max(self.peak_total, sum(by_role.values()))

    def cpu_s(self, role: str) -> float:
        """CPU seconds (user + system) used so far by the live processes of ``role``."""
        root = psutil.Process(os.getpid())
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                if _role(proc, root.pid) == role:
                    times = proc.cpu_times()
                    total += times.user + times.system
            except psutil.Error:
                continue
        return total

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.period_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_point(
    n: int, k: int, noop: bool, backend: str, rounds: int, hosts: int, repeat: int = 1, reference: bool = False
) -> dict[str, Any]:
    """One point, in this process; with ``repeat`` > 1 the same run again in the same process (Ray reused), whose
    start-up and end-to-end are reported under ``again``; with ``reference`` (training only) the bare training loop
    timed right after, in this process (``engine_overhead.pure_compute_s``), and the ratio of the steady rate to
    ``hosts`` such loops: a figure that load on the machine inflates on both sides alike."""
    began = time.perf_counter()
    sampler = PssSampler()
    sampler.start()
    from rayfl.config import BackendConfig, CNNConfig, DataConfig, ExperimentConfig, FedAvgConfig, TrainConfig
    from rayfl.engine.driver import run_experiment
    from rayfl.engine.ray_backend import shutdown_ray

    imports_s = time.perf_counter() - began
    cfg = ExperimentConfig(
        name="scale",
        rounds=rounds,
        clients_per_round=k,
        eval_every=10_000,  # only the last round is evaluated
        data=DataConfig(name="synthetic", partition="iid", num_clients=n, synthetic_samples=64),
        model=CNNConfig(channels=(16, 32)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=32, lr=0.05, optimizer="sgd", noop=noop),
        backend=BackendConfig(kind=backend, num_hosts=hosts, num_cpus=hosts),  # type: ignore[arg-type]
    )
    # the hosts' CPU over the steady rounds (after the first, before the evaluated last): how much of ``hosts`` cores
    # they got, which tells a busy machine (share well below 1) from engine overhead (share near 1, rate low)
    marks: dict[int, tuple[float, float]] = {}
    last_steady = rounds - 2 if rounds > 2 else rounds - 1

    def mark(record: Any) -> None:
        if record.round_idx in (0, last_steady):
            marks[record.round_idx] = (time.perf_counter(), sampler.cpu_s("client_host"))

    result = run_experiment(cfg, write=False, callbacks=[mark] if backend == "ray" else [])
    end_to_end_s = time.perf_counter() - began
    host_share: dict[str, float] = {}
    if 0 in marks and last_steady in marks and last_steady > 0:
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
        "steady_updates_per_s": steady_rate,
        **loops,
        **host_share,
        "end_to_end_s": end_to_end_s,
        "again": again,
        "peak_pss_mib": {role: round(v, 1) for role, v in sorted(sampler.peak_by_role.items())},
        "processes": dict(sorted(sampler.count_by_role.items())),
        "peak_pss_total_mib": round(sampler.peak_total, 1),
    }


def _startup(result: Any) -> dict[str, float]:
    """The start-up breakdown of a run: Ray start (overlapping the set-up: data, algorithm, model), the data's put,
    the actors' start, and the first round."""
    out = {key: float(result.startup_s.get(key, 0.0)) for key in ("ray_start_s", "setup_s", "put_s", "backend_s")}
    out["first_round_s"] = result.records[0].round_wall_s
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| N | K | mode | backend | updates/s (steady) | end to end s | imports s | Ray start s | set-up s (overlaps "
        "Ray start) | put s | actors s | first round s | again: end to end s | peak PSS total MiB | peak PSS by role "
        "MiB |\n|" + " --- |" * 15
    )
    lines = [head]
    for r in rows:
        roles = ", ".join(f"{k} {v:.0f}" for k, v in r["peak_pss_mib"].items())
        again = f"{r['again']['end_to_end_s']:.1f}" if r.get("again") else ""
        ratio = f" ({r['ratio_to_loops']:.2f} x {r['hosts']} loops)" if "ratio_to_loops" in r else ""
        if "steady_host_cpu_share" in r:
            ratio += f" [hosts had {r['steady_host_cpu_share']:.2f} of their cores"
            ratio += f", {r['host_cpu_ms_per_update']:.1f} CPU ms/update"
            ratio += f" vs {r['loop_cpu_ms_per_update']:.1f} bare]" if "loop_cpu_ms_per_update" in r else "]"
        lines.append(
            f"| {r['n']} | {r['k']} | {r['mode']} | {r['backend']} | {r['steady_updates_per_s']:.1f}{ratio} | "
            f"{r['end_to_end_s']:.1f} | {r['imports_s']:.2f} | {r['ray_start_s']:.2f} | {r['setup_s']:.2f} | "
            f"{r['put_s']:.2f} | {r['backend_s']:.2f} | {r['first_round_s']:.2f} | {again} | "
            f"{r['peak_pss_total_mib']:.0f} | {roles} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000, 10_000])
    parser.add_argument("--k", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--mode", choices=["train", "noop"], nargs="+", default=["train", "noop"])
    parser.add_argument("--backend", choices=["ray", "local"], default="ray")
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
        row = run_point(args.n[0], args.k[0], noop, args.backend, args.rounds, args.hosts, args.repeat, args.reference)
        print("SCALE-ROW " + json.dumps(row))
        return
    rows: list[dict[str, Any]] = []
    for n in args.n:
        for k in args.k:
            if k > n:
                continue
            for mode in args.mode:
                cmd = [sys.executable, __file__, "--point", "--n", str(n), "--k", str(k), "--mode", mode]
                cmd += ["--backend", args.backend, "--rounds", str(args.rounds), "--hosts", str(args.hosts)]
                cmd += ["--repeat", str(args.repeat)] + (["--reference"] if args.reference else [])
                out = subprocess.run(cmd, capture_output=True, text=True, check=False)
                found = [ln for ln in out.stdout.splitlines() if ln.startswith("SCALE-ROW ")]
                if out.returncode != 0 or not found:
                    sys.stderr.write(out.stderr[-4000:])
                    raise SystemExit(f"point N={n} K={k} {mode} failed (exit {out.returncode})")
                rows.append(json.loads(found[-1].removeprefix("SCALE-ROW ")))
                sys.stderr.write(f"done N={n} K={k} {mode}: {rows[-1]['steady_updates_per_s']:.1f} updates/s\n")
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    sys.stdout.write(markdown(rows) + "\n")


if __name__ == "__main__":
    main()
