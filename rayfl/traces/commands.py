"""Handlers of ``rayfl traces record|show|import|synth|fetch`` (the parsers are registered in ``rayfl.cli``).

Each handler takes the parsed arguments, prints what it did and returns an exit code; a ``TraceError`` becomes a
one-line message on stderr and exit code 2, like the other sub-commands' configuration errors.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rayfl.traces.format import Trace, TraceError, read_trace, write_trace

__all__ = ["plot_trace", "run_traces_command", "trace_stats"]


def trace_stats(trace: Trace) -> dict[str, float]:
    """min / mean / median / p5 / p95 / max of the samples (each sample counts once, whatever it holds for)."""
    v = trace.values
    return {
        "min": float(v.min()),
        "mean": float(v.mean()),
        "median": float(np.median(v)),
        "p5": float(np.percentile(v, 5)),
        "p95": float(np.percentile(v, 95)),
        "max": float(v.max()),
    }


def plot_trace(trace: Trace, out_png: str | Path, title: str) -> Path:
    """A PNG of the trace as the step function it replays as: value against seconds since the trace start."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_png)
    figure = Figure(figsize=(8.0, 4.0), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    axes.step(trace.t, trace.values, where="post", linewidth=1.0)
    axes.set_xlabel("time since trace start (s)")
    axes.set_ylabel(f"{trace.kind} ({trace.unit})")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png")
    return out


def _summary(trace: Trace) -> str:
    return f"{trace.kind} ({trace.unit}), {trace.num_samples} samples over {trace.duration_s:.3f} s"


def _record(ns: argparse.Namespace) -> int:
    from rayfl.traces.recorder import record

    print(f"rayfl: recording for {ns.duration:g} s every {ns.interval:g} s ...", flush=True)
    paths = record(ns.out, interval_s=ns.interval, duration_s=ns.duration, kinds=ns.kinds, note=ns.note)
    for path in paths.values():
        print(f"wrote {path}: {_summary(read_trace(path))}")
    return 0


def _show(ns: argparse.Namespace) -> int:
    trace = read_trace(ns.file)
    print(f"trace: {ns.file}")
    print(f"kind: {trace.kind}")
    print(f"unit: {trace.unit}")
    print(f"duration_s: {trace.duration_s:.3f}")
    print(f"samples: {trace.num_samples}")
    for name, value in trace_stats(trace).items():
        print(f"{name}: {value:.3f}")
    for key, text in trace.meta.items():
        for part in text.split("\n"):
            print(f"{key}: {part}")
    if ns.plot:
        print(f"plot: {plot_trace(trace, ns.plot, f'{Path(ns.file).name}: {trace.kind}')}")
    return 0


def _import(ns: argparse.Namespace) -> int:
    from rayfl.traces.importers import import_trace

    options: dict[str, object] = {}
    if ns.direction is not None:
        options["direction"] = ns.direction
    if ns.window_s is not None:
        if ns.format != "mahimahi":
            raise TraceError("--window-s applies to the mahimahi format only")
        options["window_s"] = ns.window_s
    trace = import_trace(ns.format, ns.src, **options)
    print(f"wrote {write_trace(ns.out, trace)}: {_summary(trace)}")
    return 0


def _synth(ns: argparse.Namespace) -> int:
    from rayfl.traces.synthetic import bandwidth_trace, memory_trace

    if ns.kind == "memory":
        trace = memory_trace(ns.seed, ns.duration, ns.interval)
    else:
        trace = bandwidth_trace(ns.seed, ns.duration, ns.interval, direction=ns.kind.removeprefix("bandwidth_"))
    print(f"wrote {write_trace(ns.out, trace)}: {_summary(trace)}")
    return 0


def _fetch(ns: argparse.Namespace) -> int:
    from rayfl.traces.sets import TRACE_SETS, fetch_trace_set

    if ns.name == "list":
        for name, trace_set in TRACE_SETS.items():
            where = "shipped with rayfl" if trace_set.shipped else "fetched into the cache"
            print(f"{name} ({where}): {trace_set.about}")
        return 0
    folder = fetch_trace_set(ns.name, Path(ns.cache_dir) if ns.cache_dir else None, ns.mirror)
    state = "ships with rayfl, nothing to fetch" if TRACE_SETS[ns.name].shipped else "ready"
    print(f"trace set {ns.name} {state}: {folder} (configs name it as trace-set:{ns.name})")
    return 0


_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "record": _record,
    "show": _show,
    "import": _import,
    "synth": _synth,
    "fetch": _fetch,
}


def run_traces_command(ns: argparse.Namespace) -> int:
    """Run ``ns.traces_command``; a bad trace or argument prints ``rayfl: error: ...`` and returns 2."""
    try:
        return _HANDLERS[ns.traces_command](ns)
    except TraceError as err:
        print(f"rayfl: error: {err}", file=sys.stderr)
        return 2
