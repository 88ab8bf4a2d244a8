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
* the steady window (Ray): the rounds after the first up to the one before the evaluated last. The PSS sampler is
  paused over it (one sample at each end), so that it takes nothing from the hosts' cores while they are timed.
  ``steady_cores``: each role's CPU seconds over the window per wall second (how much of the machine it used);
  ``steady_host_cpu_share``: the client hosts' CPU over wall seconds times hosts, i.e. how much of their cores they
  got; ``host_cpu_ms_per_update``: the hosts' CPU per client update, of which ``host_other_threads_ms_per_update``
  ran outside their main threads (Ray's core-worker threads); ``steady_round_ms``: the mean steady round taken
  apart from the driver's side (``round``: its wall; ``driver_before``: sampling, budgets, assignment, the clock's
  plan; ``slowest_host``: the busiest host's clients from receipt to trained update (``ClientOutcome.train_wall_s``);
  ``dispatch_reduce``: the rest of the hosts' call, i.e. putting the global weights, Ray's calls, the hosts'
  pre-aggregation and the shard's reduction; ``driver_after``: the server update and the record; ``imbalance``: the
  busiest host's time over the mean host's, which the other host spends waiting);
* with ``--reference`` (training only), timed in fresh processes after the run: the bare single-thread training
  loop (``engine_overhead.pure_compute``: copy the weights in, train one epoch) alone, ``one_loop_updates_per_s``
  and ``loop_cpu_ms_per_update``, and ``hosts`` such loops running side by side, ``concurrent_loops_updates_per_s``
  and ``concurrent_loop_cpu_ms_per_update``; ``ratio_to_loops`` is the steady rate over ``hosts`` lone loops (the
  issue's target: >= 0.95), ``ratio_to_concurrent_loops`` over the loops side by side (what this machine gives two
  trainings at once, whatever runs them). CPU per update of the hosts beside the loops' is the engine's own cost per
  client whatever the load;
* ``peak_pss_mib`` / ``end_pss_mib``: the proportional set size of each process role (the driver and every
  descendant: Ray's GCS, raylet, agents, workers, client hosts, shards), its peak over samples (at most 15% of a
  core's worth) and at the end of the last round, and ``peak_pss_total_mib`` the tree's peak.

Issue 30 (``--issue30``, with ``--backend ray`` or ``local``): N = 10,000, 100,000 and 1,000,000 clients, K = 100,
R = 3, labels made per image (``--labels image``: ``data.synthetic_labels: image``), reporting ``first_update_s``
(from the point's start to the first round's record: imports, Ray, data, put, actors, the first round),
``store_bytes_per_client`` (the data set pickled as the object store holds it, over N) and the driver's and each
host's PSS at the end over N (upper bounds per client: each process's fixed cost is in them).

``first_client_update_s`` (the table's "first client update"): from the point's start to the moment the run's first
client update was trained (round 0's start, when the driver hands the round to the backend, plus the training
seconds of the first client of the round's first host call), the moment ``pfl_side.py``'s ``first_update_s`` marks;
``first_update_s`` waits for the whole first round.

With ``--backend ray local`` each point runs on both, and the table ends with the measured cross-over: the number of
client updates beyond which Ray's faster rounds repay its slower start, ``(start_ray - start_local) / (1 / rate_local
- 1 / rate_ray)``, where a backend's start is its end-to-end wall minus its rounds.

Run everything: ``python benchmarks/scale.py --out scale.json`` (prints a markdown table). Subsets:
``--n 100 1000 --k 10 --mode noop train --backend ray local --rounds 3 --hosts 2``. Combinations with ``K > N`` are
skipped. ``--issue13`` runs the points of issue 13's table (``ISSUE13``) and prints that table with its targets.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from process_roles import PssSampler, host_thread_cpu  # this folder is on sys.path when run as a script


def run_point(
    n: int,
    k: int,
    noop: bool,
    backend: str,
    rounds: int,
    hosts: int,
    repeat: int = 1,
    reference: bool = False,
    labels: str = "pool",
    processes: int | str = "auto",
) -> dict[str, Any]:
    """One point, in this process, started the way ``rayfl run`` starts (Ray's start overlapping the driver's
    imports); with ``repeat`` > 1 the same run again in the same process, on the first run's warm actors
    (``backend.keep_warm``), reported under ``again``; with ``reference`` (training only) the bare training loop
    timed right after, alone and ``hosts`` side by side (see the module docstring)."""
    began = time.perf_counter()
    sampler = PssSampler()
    sampler.start()
    from rayfl.engine.backend_choice import resolve_backend
    from rayfl.engine.ray.session import prestart, shutdown_ray

    # ``auto``: the backend the run's config resolves to, measured as that backend (``engine/backend_choice.py``)
    point = workload(n, k, noop, backend, rounds, hosts, keep_warm=repeat > 1, labels=labels, processes=processes)
    cfg, choice = resolve_backend(point)
    asked, backend = backend, cfg.backend.kind
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
    last_steady = rounds - 2 if rounds > 2 else rounds - 1  # the window: rounds 1..last_steady (not the evaluated)
    window: dict[int, tuple[float, dict[str, float], tuple[float, float]]] = {}
    startup_cpu: dict[str, float] = {}
    end_pss: dict[str, float] = {}
    sampled_s = [0.0]  # the callback's own samples, left out of end_to_end_s
    first_update: list[float] = []

    def mark(record: Any) -> None:
        t0 = time.perf_counter()
        if record.round_idx == 0:  # every process's CPU seconds since it started: the cold start's CPU by role
            first_update.append(t0 - began - sampled_s[0])
            startup_cpu.update(sampler.cpu_by_role())
            sampler.sample()  # the memory at the window's start; none inside it
            if last_steady > 0:
                sampler.pause()
        if record.round_idx in (0, last_steady):
            window[record.round_idx] = (time.perf_counter(), sampler.cpu_by_role(), host_thread_cpu())
        if record.round_idx == last_steady:
            sampler.sample()
            sampler.resume()
        if record.round_idx == rounds - 1:  # every process at the end of the run, before the actors go
            sampler.sample()
            end_pss.update(sampler.last_by_role)
        sampled_s[0] += time.perf_counter() - t0

    data_bytes = pickled_bytes(data[0]) if data else float("nan")
    if not data and labels == "image":  # in-process: what the data set would be in a store (cheap to remake)
        from rayfl.data import build_federated_dataset

        data_bytes = pickled_bytes(build_federated_dataset(cfg.data, cfg.seed))
    calls: list[tuple[float, list[float]]] = []
    first_call: list[float] = []
    with host_busy_log(calls if backend == "ray" else None), first_client_log(backend, first_call):
        called = time.perf_counter()
        result = run_experiment(cfg, write=False, callbacks=[mark], dataset=data.pop() if data else None)
    end_to_end_s = time.perf_counter() - began - sampled_s[0]
    steady = steady_figures(result.records, calls, window, k, hosts, last_steady) if backend == "ray" else {}
    again: dict[str, Any] = {}
    for _ in range(repeat - 1):
        t0 = time.perf_counter()
        second = run_experiment(cfg, write=False)
        again = {"end_to_end_s": time.perf_counter() - t0, **_startup(second)}
    sampler.stop()
    shutdown_ray()
    walls = [r.round_wall_s for r in result.records]
    steady_walls = walls[1:-1] if len(walls) > 2 else walls[1:]
    steady_rate = k * len(steady_walls) / sum(steady_walls) if steady_walls and sum(steady_walls) > 0 else float("nan")
    loops = reference_loops(cfg, hosts, steady_rate) if reference and not noop else {}
    return {
        "n": n,
        "k": k,
        "mode": "noop" if noop else "train",
        "backend": (backend if asked == backend else f"{asked}: {backend}")
        + (f" (processes {processes})" if backend == "local" and processes != "auto" else ""),
        "worker_processes": processes,
        "backend_reason": choice.reason,
        "hosts": hosts,
        "rounds": rounds,
        "imports_s": imports_s,
        **_startup(result),
        **early,
        "steady_updates_per_s": steady_rate,
        **loops,
        **steady,
        "end_to_end_s": end_to_end_s,
        "first_update_s": first_update[0] if first_update else float("nan"),
        # as pfl_side.py's first_update_s: to the first client's trained update (round 0's first call's first client)
        "first_client_update_s": first_call[0] + first_call[1] - began if first_call else float("nan"),
        # as pfl_side.py's first_update_after_call_s: from the run's call (imports and Ray's start before it left out)
        "first_client_update_after_call_s": first_call[0] + first_call[1] - called if first_call else float("nan"),
        **bytes_per_client(data_bytes, n, end_pss, hosts),
        "start_s": end_to_end_s - sum(walls),  # everything but the rounds: imports, Ray, data, actors, close
        "again": again,
        "startup_cpu_s": {role: round(v, 2) for role, v in sorted(startup_cpu.items())},
        "peak_pss_mib": {role: round(v, 1) for role, v in sorted(sampler.peak_by_role.items())},
        "end_pss_mib": {role: round(v, 1) for role, v in sorted(end_pss.items())},
        "processes": dict(sorted(sampler.count_by_role.items())),
        "peak_pss_total_mib": round(sampler.peak_total, 1),
    }


def pickled_bytes(obj: Any) -> float:
    """Bytes of ``obj`` pickled as Ray's object store holds it (protocol 5, out-of-band buffers counted)."""
    import pickle

    buffers: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return float(len(blob) + sum(memoryview(b).nbytes for b in buffers))


def bytes_per_client(data_bytes: float, n: int, end_pss: dict[str, float], hosts: int) -> dict[str, float]:
    """What a client costs: the data set in the object store per client (its pickle, as put), and the driver's and
    each host's PSS at the end of the run over the population (upper bounds: a process's fixed cost is in them)."""
    mib = 2.0**20
    return {
        "store_bytes_per_client": data_bytes / n,
        "driver_pss_bytes_per_client": end_pss.get("driver", float("nan")) * mib / n,
        "host_pss_bytes_per_client": end_pss.get("client_host", float("nan")) * mib / max(1, hosts) / n,
    }


def workload(
    n: int,
    k: int,
    noop: bool,
    backend: str,
    rounds: int,
    hosts: int,
    keep_warm: bool = False,
    labels: str = "pool",
    processes: int | str = "auto",
) -> Any:
    """The issue's FedAvg workload as an ``ExperimentConfig``; ``labels``: ``data.synthetic_labels``; ``processes``:
    the in-process backend's worker processes (``backend.processes``)."""
    from rayfl.config.model import CNNConfig
    from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
    from rayfl.experiment.schema import ExperimentConfig
    from rayfl.fl.methods.fedavg.config import FedAvgConfig

    return ExperimentConfig(
        name="scale",
        rounds=rounds,
        clients_per_round=k,
        eval_every=10_000,  # only the last round is evaluated
        data=DataConfig(
            name="synthetic", partition="iid", num_clients=n, synthetic_samples=64, synthetic_labels=labels
        ),  # type: ignore[arg-type]
        model=CNNConfig(channels=(16, 32)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=32, lr=0.05, optimizer="sgd", noop=noop),
        backend=BackendConfig(
            kind=backend,  # type: ignore[arg-type]
            num_hosts=hosts,
            num_cpus=hosts,
            keep_warm=keep_warm,
            processes=processes,  # type: ignore[arg-type]
        ),
    )


@contextlib.contextmanager
def host_busy_log(calls: list[tuple[float, list[float]]] | None) -> Iterator[None]:
    """Log each ``RayBackend.train_and_reduce``: its wall seconds and each host's busy seconds (the sum of its
    clients' ``train_wall_s``). Benchmark instrumentation of the driver's view, in this process only; nothing is
    logged with ``None``."""
    if calls is None:
        yield
        return
    from rayfl.engine.exec.backend import tasks_by_host
    from rayfl.engine.ray.backend import RayBackend

    inner = RayBackend.train_and_reduce

    def timed(self: Any, tasks: Any, params: Any, *rest: Any) -> Any:
        began = time.perf_counter()
        aggregate, outcomes = inner(self, tasks, params, *rest)
        spent = {o.client_id: o.train_wall_s for o in outcomes}
        groups = tasks_by_host(tasks, self.sizes, self.num_hosts)
        calls.append((time.perf_counter() - began, [sum(spent.get(t.client_id, 0.0) for t in g) for g in groups]))
        return aggregate, outcomes

    RayBackend.train_and_reduce = timed  # type: ignore[method-assign]
    try:
        yield
    finally:
        RayBackend.train_and_reduce = inner  # type: ignore[method-assign]


@contextlib.contextmanager
def first_client_log(backend: str, out: list[float]) -> Iterator[None]:
    """Fill ``out`` with round 0's start (``perf_counter``, when the first ``train_and_reduce`` is called) and the
    training seconds of that call's first client (the first outcome: the first client of the round's first host
    call, which starts with the round): their sum is when the run's first client update was trained, the moment
    ``pfl_side.py`` calls its first update. Benchmark instrumentation in this process only."""
    from rayfl.engine.exec.backend import LocalBackend

    cls: Any = LocalBackend
    if backend == "ray":
        from rayfl.engine.ray.backend import RayBackend

        cls = RayBackend
    inner = cls.train_and_reduce

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        aggregate, outcomes = inner(self, *args, **kwargs)
        if not out and outcomes:
            out.extend([began, outcomes[0].train_wall_s])
        return aggregate, outcomes

    cls.train_and_reduce = timed
    try:
        yield
    finally:
        cls.train_and_reduce = inner


def steady_figures(
    records: Sequence[Any],
    calls: Sequence[tuple[float, list[float]]],
    window: dict[int, tuple[float, dict[str, float], tuple[float, float]]],
    k: int,
    hosts: int,
    last_steady: int,
) -> dict[str, Any]:
    """The steady window's CPU by role, the hosts' share of their cores and CPU per update, and the mean round taken
    apart (see the module docstring); empty without a window (fewer than 2 rounds)."""
    if 0 not in window or last_steady not in window or last_steady == 0:
        return {}
    (t0, cpu0, (main0, other0)), (t1, cpu1, (main1, other1)) = window[0], window[last_steady]
    wall, updates = t1 - t0, k * last_steady
    host_cpu = cpu1.get("client_host", 0.0) - cpu0.get("client_host", 0.0)
    cores = {role: round((cpu1[role] - cpu0.get(role, 0.0)) / wall, 3) for role in sorted(cpu1)}
    parts: dict[str, list[float]] = {}
    for record, (backend_s, busy) in zip(records[1 : last_steady + 1], calls[1 : last_steady + 1], strict=False):
        slowest = max(busy) if busy else 0.0
        for name, value in (
            ("round", record.round_wall_s),
            ("driver_before", record.train_wall_s - backend_s),
            ("slowest_host", slowest),
            ("dispatch_reduce", backend_s - slowest),
            ("driver_after", record.round_wall_s - record.train_wall_s),
            ("imbalance", slowest - sum(busy) / max(1, len(busy))),
        ):
            parts.setdefault(name, []).append(1000 * value)
    return {
        "steady_host_cpu_share": host_cpu / (wall * hosts),
        "host_cpu_ms_per_update": 1000 * host_cpu / updates,
        "host_main_thread_ms_per_update": 1000 * (main1 - main0) / updates,
        "host_other_threads_ms_per_update": 1000 * (other1 - other0) / updates,
        "steady_cores": cores,
        "steady_round_ms": {name: round(sum(v) / len(v), 2) for name, v in parts.items()},
    }


def _loop_part(args: tuple[Any, int, int, int]) -> tuple[float, float]:
    """One of the concurrent bare loops, in a fresh process with a client host's allocator thresholds."""
    from engine_overhead import pure_compute

    from rayfl.engine.exec.allocator import tune_allocator

    tune_allocator()
    cfg, rounds, part, parts = args
    return pure_compute(cfg, rounds, part, parts)


def reference_loops(cfg: Any, hosts: int, steady_rate: float, rounds: int = 2) -> dict[str, float]:
    """The bare loop over ``rounds`` rounds' clients alone, then split over ``hosts`` processes side by side, each in
    a fresh process (as a client host is), after the run (its processes are gone)."""
    ctx = multiprocessing.get_context("spawn")
    updates = cfg.clients_per_round * rounds
    with ctx.Pool(1) as pool:
        ((wall, cpu),) = pool.map(_loop_part, [(cfg, rounds, 0, 1)])
    with ctx.Pool(hosts) as pool:
        parts = pool.map(_loop_part, [(cfg, rounds, h, hosts) for h in range(hosts)])
    both_rate = updates / max(w for w, _ in parts)
    return {
        "one_loop_updates_per_s": updates / wall,
        "loop_cpu_ms_per_update": 1000 * cpu / updates,
        "concurrent_loops_updates_per_s": both_rate,
        "concurrent_loop_cpu_ms_per_update": 1000 * sum(c for _, c in parts) / updates,
        "ratio_to_loops": steady_rate * wall / (hosts * updates),
        "ratio_to_concurrent_loops": steady_rate / both_rate,
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
        "| N | K | mode | backend | updates/s (steady) | end to end s | first client update s | imports s "
        "| Ray start s | beside it: driver imports s, data s | set-up s | actors ready s | first round s "
        "| again (warm actors): end to end s | start-up CPU s (by role) | peak PSS MiB | PSS by role at the end MiB "
        "|\n|" + " --- |" * 17
    )
    lines = [head]
    for r in rows:
        roles = ", ".join(f"{k} {v:.0f}" for k, v in r["end_pss_mib"].items())
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in r["startup_cpu_s"].items() if v >= 0.05)
        again = f"{r['again']['end_to_end_s']:.1f}" if r.get("again") else ""
        beside = f"{r['prestart_import_s']:.2f}, {r['prestart_load_s']:.2f}" if "prestart_s" in r else ""
        lines.append(
            f"| {r['n']} | {r['k']} | {r['mode']} | {r['backend']} | {r['steady_updates_per_s']:.1f} | "
            f"{r['end_to_end_s']:.1f} | {r.get('first_client_update_s', math.nan):.2f} | {r['imports_s']:.2f} | "
            f"{r.get('prestart_ray_start_s', 0.0):.2f} | {beside} | "
            f"{r['setup_s']:.2f} | {r['backend_s']:.2f} | {r['first_round_s']:.2f} | {again} | "
            f"{sum(r['startup_cpu_s'].values()):.1f} ({cpu}) | {r['peak_pss_total_mib']:.0f} | {roles} |"
        )
    steady = [r for r in rows if "steady_round_ms" in r]
    if steady:
        lines.append(
            "\nSteady rounds on Ray (the PSS sampler paused):\n\n| N | K | mode | updates/s | x lone loops | x loops "
            "side by side | hosts' share of their cores | host CPU ms/update (Ray's threads) | loop CPU ms/update "
            "alone, side by side | mean round ms: driver before, slowest host, dispatch+reduce, driver after "
            "(imbalance) | cores used by role |\n|" + " --- |" * 11
        )
        for r in steady:
            ms = r["steady_round_ms"]
            ratios, loop_cpu = " | ", ""
            if "loop_cpu_ms_per_update" in r:
                ratios = f"{r['ratio_to_loops']:.2f} | {r['ratio_to_concurrent_loops']:.2f}"
                loop_cpu = f"{r['loop_cpu_ms_per_update']:.2f}, {r['concurrent_loop_cpu_ms_per_update']:.2f}"
            cores = ", ".join(f"{k} {v:.2f}" for k, v in r["steady_cores"].items() if v >= 0.005)
            lines.append(
                f"| {r['n']} | {r['k']} | {r['mode']} | {r['steady_updates_per_s']:.1f} | {ratios} | "
                f"{r['steady_host_cpu_share']:.2f} | {r['host_cpu_ms_per_update']:.2f} "
                f"({r['host_other_threads_ms_per_update']:.2f}) | {loop_cpu} | {ms['round']:.1f}: "
                f"{ms['driver_before']:.1f}, {ms['slowest_host']:.1f}, {ms['dispatch_reduce']:.1f}, "
                f"{ms['driver_after']:.1f} ({ms['imbalance']:.1f}) | {cores} |"
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


# Issue 13's table: (N, K, mode, backends, rounds, repeat, reference), each point as its own scale.py command
ISSUE13: tuple[tuple[int, int, str, tuple[str, ...], int, int, bool], ...] = (
    (100, 10, "train", ("ray", "local"), 3, 2, False),  # end to end and peak PSS at N=100; the local fast path
    (10_000, 100, "train", ("ray",), 3, 1, True),  # end to end, peak PSS and steady rate at N=10,000
    (1_000, 20, "train", ("ray",), 8, 1, True),  # the steady rate against two bare loops
    (1_000, 100, "noop", ("ray",), 8, 1, False),  # the framework ceiling
    (10_000, 1_000, "noop", ("ray",), 8, 1, False),  # the ceiling at 10,000 clients, 1,000 per round (item 3)
)
GB_MIB = 1e9 / 2**20  # the issue's memory targets are in GB (10^9 bytes): 1.0 GB = 953.7 MiB


def issue13_table(rows: list[dict[str, Any]]) -> str:
    """The issue's table with rayfl's measured column, its target and whether it is met."""

    def row(n: int, k: int, mode: str, backend: str = "ray") -> dict[str, Any] | None:
        """The row of the issue's point (N, K): measured there, or shrunk from there (``issue13_point``)."""
        found = [
            r
            for r in rows
            if (*r.get("issue13_point", (r["n"], r["k"])), r["mode"], r["backend"]) == (n, k, mode, backend)
        ]
        return found[0] if found else None

    lines = ["| workload | rayfl (measured) | target | met |", "| --- | --- | --- | --- |"]

    def add(label: str, value: str, target: str, met: bool | None) -> None:
        lines.append(f"| {label} | {value} | {target} | {'-' if met is None else ('yes' if met else 'NO')} |")

    for n, k in ((1_000, 20), (10_000, 100)):
        r = row(n, k, "train")
        if r is not None and "ratio_to_loops" in r:
            value = (
                f"{r['steady_updates_per_s']:.1f} = {r['ratio_to_loops']:.2f} x {r['hosts']} lone loops "
                f"({r['one_loop_updates_per_s']:.1f}/s each), {r['ratio_to_concurrent_loops']:.2f} x the loops side "
                f"by side ({r['concurrent_loops_updates_per_s']:.1f}/s)"
            )
            add(f"steady updates/s, N={n:,}, {k} per round", value, ">= 0.95 x two single-thread loops",
                r["ratio_to_loops"] >= 0.95)  # fmt: skip
    for n, k, limit in ((100, 10, 4.0), (10_000, 100, 15.0)):
        r, local = row(n, k, "train"), row(n, k, "train", "local")
        if r is not None:
            value = f"{r['end_to_end_s']:.1f} s on Ray" + (f" ({local['end_to_end_s']:.1f} s local)" if local else "")
            add(f"end-to-end wall, N={n:,}, {k} per round, {r['rounds']} rounds", value, f"<= {limit:g} s",
                r["end_to_end_s"] <= limit)  # fmt: skip
    for n, k, limit_gb in ((100, 10, 1.0), (10_000, 100, 2.0)):
        r, local = row(n, k, "train"), row(n, k, "train", "local")
        if r is not None:
            mib = r["peak_pss_total_mib"]
            value = f"{mib:,.0f} MiB = {mib / GB_MIB:.2f} GB on Ray"
            value += f" ({local['peak_pss_total_mib']:,.0f} MiB local)" if local else ""
            add(f"peak PSS of the process tree, N={n:,}", value, f"<= {limit_gb:g} GB ({limit_gb * GB_MIB:,.0f} MiB)",
                mib <= limit_gb * GB_MIB)  # fmt: skip
    for n, k in ((1_000, 100), (10_000, 1_000)):
        r = row(n, k, "noop")
        if r is not None:
            add(f"framework ceiling (no-op clients), N={n:,}, {k:,} per round",
                f"{r['steady_updates_per_s']:,.0f}/s", ">= 2,500/s", r["steady_updates_per_s"] >= 2500)  # fmt: skip
    return "\n".join(lines)


# Issue 30's populations (K = 100, R = 3, data.synthetic_labels: image): ``--issue30 --backend ray`` (or ``local``)
ISSUE30_N = (10_000, 100_000, 1_000_000)


def issue30_table(rows: list[dict[str, Any]]) -> str:
    """Issue 30's table: time to first update (target <= 15 s at 1M: the first round's record, every update of round 0
    in) and its parts, when round 0 starts (the first clients start training: the first update less the round), end
    to end, peak PSS (target <= 2.5 GB at 1M) with its largest roles, steady updates/s (no lower than at 10k) and
    bytes per client."""
    lines = [
        "| N | backend | first update s (imports, Ray, data set-up, put, actors ready, first round) | first clients "
        "train at s | end to end s | peak PSS MiB (GB) | largest roles at the end MiB | steady updates/s | bytes per "
        "client: store, driver PSS, host PSS |",
        "|" + " --- |" * 9,
    ]
    for r in rows:
        ray_s = r.get("prestart_ray_start_s", r.get("ray_start_s", 0.0))
        data_s = r.get("prestart_load_s", 0.0) + r.get("setup_s", 0.0)  # on Ray the data loads beside Ray's start
        parts = ", ".join(f"{v:.2f}" for v in (r["imports_s"], ray_s, data_s, r["put_s"], r["backend_s"]))
        roles = sorted(r["end_pss_mib"].items(), key=lambda kv: -kv[1])[:3]
        lines.append(
            f"| {r['n']:,} | {r['backend']} | {r['first_update_s']:.1f} ({parts}, {r['first_round_s']:.2f}) | "
            f"{r['first_update_s'] - r['first_round_s']:.1f} | {r['end_to_end_s']:.1f} | "
            f"{r['peak_pss_total_mib']:,.0f} ({r['peak_pss_total_mib'] / GB_MIB:.2f}) | "
            f"{', '.join(f'{k} {v:.0f}' for k, v in roles)} | {r['steady_updates_per_s']:.1f} | "
            f"{r['store_bytes_per_client']:.1f}, {r['driver_pss_bytes_per_client']:.0f}, "
            f"{r['host_pss_bytes_per_client']:.0f} |"
        )
    return "\n".join(lines)


def point_commands(args: argparse.Namespace) -> list[tuple[int, int, str, str, int, int, bool, tuple[int, int]]]:
    """The points to run, each with the (N, K) of the issue's table it stands for: ``ISSUE13``'s (shrunk by
    ``--shrink``: N and K divided, at most 3 rounds, for a quick check that the command works) or the cross product
    of ``--n``, ``--k``, ``--mode``, ``--backend``."""
    if args.issue30:
        ns = args.n or ISSUE30_N
        return [(n, 100, "train", backend, 3, 1, False, (n, 100)) for n in ns for backend in args.backend]
    if args.issue13:
        out = []
        for n, k, mode, backends, rounds, repeat, reference in ISSUE13:
            n2 = max(1, n // args.shrink)
            k2 = min(n2, max(1, k // args.shrink))
            r2 = rounds if args.shrink == 1 else min(rounds, 3)
            out += [(n2, k2, mode, backend, r2, repeat, reference, (n, k)) for backend in backends]
        return out
    return [
        (n, k, mode, backend, args.rounds, args.repeat, args.reference, (n, k))
        for n in args.n or (100, 1000, 10_000)
        for k in args.k
        if k <= n
        for mode in args.mode
        for backend in args.backend
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=None, help="default: 100 1000 10000 (issue 30: its N)")
    parser.add_argument("--k", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--mode", choices=["train", "noop"], nargs="+", default=["train", "noop"])
    parser.add_argument("--backend", choices=["ray", "local", "auto"], nargs="+", default=["ray"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="runs per point in one process (2: Ray reused)")
    parser.add_argument("--reference", action="store_true", help="time the bare training loop too (see run_point)")
    parser.add_argument("--issue13", action="store_true", help="the points of issue 13's table (ISSUE13), and it")
    parser.add_argument("--issue30", action="store_true", help="the points of issue 30's table (ISSUE30), and it")
    parser.add_argument("--labels", choices=["pool", "image"], default="pool", help="data.synthetic_labels")
    parser.add_argument("--shrink", type=int, default=1, help="with --issue13: N and K divided by this (a check)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the rows (default: print only)")
    parser.add_argument(
        "--processes",
        default="auto",
        help="the in-process backend's worker processes (backend.processes: N or auto, the default)",
    )
    parser.add_argument("--point", action="store_true", help=argparse.SUPPRESS)  # internal: one point, JSON out
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.point:
        noop = args.mode[0] == "noop"
        row = run_point(
            (args.n or [100])[0],
            args.k[0],
            noop,
            args.backend[0],
            args.rounds,
            args.hosts,
            args.repeat,
            args.reference,
            args.labels,
            args.processes if args.processes == "auto" else int(args.processes),
        )
        print("SCALE-ROW " + json.dumps(row))
        return
    rows: list[dict[str, Any]] = []
    for n, k, mode, backend, rounds, repeat, reference, issue_point in point_commands(args):
        cmd = [sys.executable, __file__, "--point", "--n", str(n), "--k", str(k), "--mode", mode]
        cmd += ["--backend", backend, "--rounds", str(rounds), "--hosts", str(args.hosts)]
        cmd += ["--repeat", str(repeat)] + (["--reference"] if reference else [])
        cmd += ["--labels", "image" if args.issue30 else args.labels, "--processes", args.processes]
        load = os.getloadavg()[0]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        found = [ln for ln in out.stdout.splitlines() if ln.startswith("SCALE-ROW ")]
        if out.returncode != 0 or not found:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit(f"point N={n} K={k} {mode} {backend} failed (exit {out.returncode})")
        row = json.loads(found[-1].removeprefix("SCALE-ROW "))
        rows.append({**row, "issue13_point": issue_point, "load_average_1min_before": load})
        sys.stderr.write(f"done N={n} K={k} {mode} {backend}: {rows[-1]['steady_updates_per_s']:.1f} updates/s\n")
    table = markdown(rows) + ("\n\nIssue 13's table:\n\n" + issue13_table(rows) if args.issue13 else "")
    table += "\n\nIssue 30's table:\n\n" + issue30_table(rows) if args.issue30 else ""
    if args.out is not None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
        report = {
            "command": "python benchmarks/scale.py " + " ".join(sys.argv[1:]),
            "commit": commit.stdout.strip(),
            "cpus": os.cpu_count(),
            "rows": rows,
            "table": table,
        }
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    sys.stdout.write(table + "\n")


if __name__ == "__main__":
    main()
