"""``rayfl`` command line: parse, build, run. No logic beyond wiring.

rayfl run [FILE] [key=value ...]      run an experiment (no FILE: the embedded default)
rayfl run --resume RUN_DIR [k=v ...]  continue a stopped run from its newest checkpoint
rayfl validate [--explain] FILE [k=v]  check a config without running it (--explain: each value and its origin)
rayfl search FILE [key=value ...]     search-only run: assign models to budgets for the rounds, no training
rayfl sweep [--check] FILE [key=value]  a Ray Tune sweep (key=value: sweep fields; base.KEY=V: the base experiment)
rayfl sweep --resume SWEEP_DIR        continue an interrupted sweep (finished trials kept, others resumed)
rayfl data prepare shakespeare        build the embedded default data set into the cache
rayfl report RUN_DIR [RUN_DIR ...]    markdown table and accuracy plot of finished runs (--paper: paper 000's layouts)
rayfl export RUN_DIR [OUT]            a stopped run's models from its checkpoint, as a finished run exports them
rayfl traces record|show|import|synth|fetch  resource traces: record, inspect, convert, generate, fetch a named set
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import signal
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rayfl.engine.stop import StopRequests
    from rayfl.experiment.schema import ExperimentConfig
    from rayfl.tune.spec import Sweep

__all__ = ["DEFAULT_CONFIG", "main"]

DEFAULT_CONFIG = "default.yaml"


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    """The first argument is the config file unless it is already an override (contains '=')."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _load(path: str | None, overrides: list[str]):  # type: ignore[no-untyped-def]
    from rayfl.experiment.loader import load_config

    if path is None:
        with resources.as_file(resources.files("rayfl.configs") / DEFAULT_CONFIG) as default:
            return _outliving_job(_name_follows_method(load_config(default, overrides), default, overrides))
    return _outliving_job(_name_follows_method(load_config(path, overrides), path, overrides))


def _outliving_job(cfg: ExperimentConfig) -> ExperimentConfig:
    """Under ``ray job submit``, a relative output_dir moved out of the job's working directory, which Ray deletes
    (``engine/persist/job_output.py``); said at start."""
    import dataclasses

    from rayfl.engine.persist.job_output import job_output_dir

    output_dir, note = job_output_dir(cfg.output_dir)
    if note is None:
        return cfg
    print(note, flush=True)
    return dataclasses.replace(cfg, output_dir=output_dir)


def _name_follows_method(cfg: ExperimentConfig, path: str | Path, overrides: list[str]) -> ExperimentConfig:
    """A run's name from its file follows a method given by override: ``setting3.yaml algorithm.name=fedavg`` runs as
    ``setting3-fedavg`` (the file's method in the name replaced, else the method appended), not under the name of
    the method the file names. A name given by override is kept as it is."""
    import dataclasses

    import yaml

    keys = [text.partition("=")[0].strip() for text in overrides]
    if "name" in keys or not {"algorithm.name", "algorithm"} & set(keys):
        return cfg
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        before = str(raw["algorithm"]["name"]) if isinstance(raw.get("algorithm"), dict) else "fedavg"
    except (OSError, yaml.YAMLError, AttributeError, KeyError, TypeError):
        return cfg
    method = cfg.algorithm.name
    if method == before:
        return cfg
    parts = cfg.name.split("-")
    name = "-".join(method if p == before else p for p in parts) if before in parts else f"{cfg.name}-{method}"
    return dataclasses.replace(cfg, name=name)


@contextlib.contextmanager
def _located(path: str | None, overrides: list[str]) -> Iterator[None]:
    """Errors raised after loading at a key but with no file (``output_dir``, ``model.factory``, checks against the
    loaded data) are located like the loader's own: at the line or override of ``path`` and ``overrides`` that set
    the key."""
    from rayfl.core.errors import ConfigError
    from rayfl.experiment.loader import locate_error

    try:
        yield
    except ConfigError as err:
        if path is None:
            with resources.as_file(resources.files("rayfl.configs") / DEFAULT_CONFIG) as default:
                located = locate_error(err, default, overrides)
        else:
            located = locate_error(err, path, overrides)
        if located is err:
            raise
        raise located from err


# exit codes of ``rayfl run`` besides 0 (finished with a finite model) and 2 (bad input): a non-finite final model or a
# run stopped by the non-finite guard (3); Ray actors that kept dying (4); a file of the run that could not be written,
# e.g. on a full disk (5); a run stopped by a signal exits 128 + the signal number (130 SIGINT, 143 SIGTERM)
EXIT_NOT_FINITE = 3
EXIT_ACTORS_FAILED = 4
EXIT_WRITE_FAILED = 5


# what ``rayfl run`` imports while Ray starts (torch and the engine, the report's pandas and matplotlib)
_RUN_MODULES = ("rayfl.engine.driver", "rayfl.report")


def _cmd_run(ns: argparse.Namespace) -> int:
    from rayfl.engine.stop import StopRequests

    # from the first moment, SIGINT/SIGTERM stop the start-up at once (it has written nothing), even where the process
    # inherited SIGINT ignored (a job put in the background by a script); the run's own handlers take over from it
    with StopRequests(setup=True) as startup:
        resume = _local_run_dir(ns.resume) if ns.resume else None
        cfg = _load_resumed(resume, ns.args) if resume is not None else _load(*_split(ns.args))
        path, overrides = _split(ns.args)
        with _located(str(resume / "config.yaml") if resume is not None else path, overrides):
            return _run_loaded(cfg, resume, startup)


def _run_loaded(cfg: ExperimentConfig, resume: Path | None, startup: StopRequests) -> int:
    if resume is not None and _nothing_to_resume(cfg, resume):
        return 0
    from rayfl.engine.startup import plan_start

    plan = plan_start(cfg, resume=resume)  # the backend chosen and where the run writes checked, once
    cfg = plan.cfg
    print(
        f"rayfl: {'resuming' if resume else 'running'} {cfg.name!r}: {cfg.algorithm_label} on {cfg.data.name}, "
        f"{cfg.rounds} rounds, {cfg.clients_per_round} clients per round, backend {plan.choice.describe()}",
        flush=True,
    )
    data = []
    if resume is None:
        _check_inputs(cfg)  # before Ray starts and the data loads
    if cfg.backend.kind == "ray" and resume is None:  # a resume is checked before anything starts
        from rayfl.engine.ray.session import prestart

        # Ray's start waits on its processes: import and load the data meanwhile, and start the actors once it is up
        data.append(prestart(cfg, _RUN_MODULES).dataset)
    from rayfl.engine.driver import run_experiment
    from rayfl.engine.guard import NonFiniteError
    from rayfl.engine.policies import is_asynchronous
    from rayfl.engine.progress import ProgressLine
    from rayfl.engine.stop import RunInterrupted
    from rayfl.report import report

    try:
        result = run_experiment(
            cfg,
            callbacks=[ProgressLine(sys.stdout, cfg.rounds, asynchronous=is_asynchronous(cfg.server))],
            plan=plan,
            dataset=data.pop() if data else None,  # popped: the run keeps only the object store's view of it
        )
        startup.release()  # the report below: Python's own Ctrl-C (its files are written whole, report/atomic.py)
    except RunInterrupted as stop:
        print(f"rayfl: {stop}", file=sys.stderr)
        pngs: list[Path] = []
        if stop.run_dir is not None:  # the report of the rounds done (a resumed run's end rewrites it)
            _, pngs = report([stop.run_dir], stop.run_dir)
        where = _published(stop.run_dir)
        print(f"results: {where} (records complete through round {stop.rounds_done - 1})")
        for png in pngs:
            print(f"plot: {where}/{png.name}")
        return 128 + stop.signum
    except NonFiniteError as err:
        print(f"rayfl: error: {err}", file=sys.stderr)
        return EXIT_NOT_FINITE
    acc, base = result.final_eval.accuracy, result.baseline_acc
    print(
        f"final test accuracy {100 * acc:.2f}% (most-frequent-label baseline {100 * base:.2f}%) "
        f"on {result.final_eval.num_samples} test samples"
    )
    failed = [r for r in result.records if r.clients_sampled > 0 and r.clients_failed == r.clients_sampled]
    if failed:
        print(
            f"rayfl: warning: every sampled client failed in {len(failed)} of {len(result.records)} rounds (the model "
            "did not change in them): see the failure columns of clients.csv",
            file=sys.stderr,
        )
    if result.run_dir is not None:
        _, pngs = report([result.run_dir], result.run_dir)
        where = _published(result.run_dir)
        print(f"results: {where}")
        for png in pngs:
            print(f"plot: {where}/{png.name}")
    if not result.model_finite or not math.isfinite(acc):
        print("rayfl: error: the final model is not finite (or scores NaN)", file=sys.stderr)
        return EXIT_NOT_FINITE
    return 0


def _local_run_dir(given: str, key: str = "--resume") -> Path:
    """The run directory ``given`` (``--resume``'s, ``export``'s); a storage URI's run directory read back into a
    staging folder first (``engine/persist/storage.py``), where the command writes and from which it is copied
    back."""
    from rayfl.core.files import is_storage_uri

    if not is_storage_uri(given):
        return Path(given)
    from rayfl.core.errors import ConfigError
    from rayfl.engine.persist.storage import RunMirror, check_storage

    mirror = RunMirror.staging(given, key=key)
    check_storage(mirror.remote, key)  # the command writes there: a read-only copy is refused now
    if mirror.pull() == 0:
        raise ConfigError("holds no run (nothing found there): give the URI of the run directory", file=given)
    return mirror.local


def _published(run_dir: Path | None) -> str:
    """Where a run's results are: a run on a storage URI gets its last files (the report) copied there and its
    staging folder removed, and is named by its URI; a local run by its directory."""
    from rayfl.engine.persist.storage import RunMirror

    if run_dir is None:
        return "None"
    mirror = RunMirror.of(run_dir)
    if mirror is None:
        return str(run_dir)
    mirror.push()
    mirror.discard()
    return mirror.remote.shown


def _nothing_to_resume(cfg: ExperimentConfig, run_dir: Path) -> bool:
    """Before anything starts: refuse a config that differs from the run's (``--resume RUN rounds=12``), and say so
    when the run finished all its rounds already (True: nothing to do, Ray is not started)."""
    import json

    from rayfl.engine.persist.checkpoint import CheckpointStore
    from rayfl.engine.persist.resume import check_same_config, load_resume_point

    check_same_config(cfg, run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = {}  # no summary (the process was killed): the checkpoint decides
    if summary.get("status") != "finished" or summary.get("rounds") != cfg.rounds:
        if not CheckpointStore(run_dir, cfg.checkpoint.keep).manifests():
            load_resume_point(cfg, run_dir)  # no checkpoint: its refusal, at once (the run loads the one there is)
        return False
    print(
        f"rayfl: {run_dir} finished all {cfg.rounds} rounds already: nothing to resume (its report: "
        f"{run_dir / 'report.md'}; to train longer, start a new run with more rounds)"
    )
    return True


def _load_resumed(run_dir: Path, args: list[str]):  # type: ignore[no-untyped-def]
    """A run directory's own config with ``key=value`` overrides (checked against it when the run starts)."""
    from rayfl.core.errors import ConfigError

    path, overrides = _split(args)
    if path is not None:
        raise ConfigError(
            f"--resume reads the run's own config.yaml, so {path!r} is not needed: give only key=value overrides "
            "(backend.*, checkpoint.*)",
            file=str(run_dir),
        )
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise ConfigError("not a run directory (no config.yaml): give the directory a run wrote", file=str(run_dir))
    return _load(str(config), overrides)


def _check_before_start(cfg: ExperimentConfig) -> None:
    """What ``validate`` checks without loading the data: a run directory can be made, the trackers asked for have
    their packages (``run`` checks both in ``engine/startup.py``'s ``plan_start``), and ``_check_inputs``."""
    from rayfl.engine.persist.tracking import check_tracking
    from rayfl.experiment.loader import check_output_dir

    check_output_dir(cfg.output_dir)
    check_tracking(cfg)
    _check_inputs(cfg)


def _check_inputs(cfg: ExperimentConfig) -> None:
    """What ``validate`` and ``run`` check of a run's inputs without loading the data: a table's columns (from its
    files' metadata) give an input the model reads, the factories import, the smallest model fits the network, and a
    custom model suits the method and the training set-up (``engine/preflight.py``)."""
    from rayfl.experiment.loader import check_factories

    if cfg.data.name == "parquet":
        from rayfl.engine.preflight import check_table_data

        check_table_data(cfg)
    check_factories(cfg)
    from rayfl.engine.preflight import check_family_fits

    check_family_fits(cfg)  # a named smallest model the network cannot hold
    if cfg.model.name == "custom":  # torch and the methods are imported for custom models only
        from rayfl.engine.preflight import check_custom_model

        check_custom_model(cfg)


def _cmd_validate(ns: argparse.Namespace) -> int:
    path, overrides = _split(ns.args)
    cfg = _load(path, overrides)

    with _located(path, overrides):
        _check_before_start(cfg)
    if ns.explain:
        from rayfl.experiment.explain import explain

        if path is None:
            with resources.as_file(resources.files("rayfl.configs") / DEFAULT_CONFIG) as default:
                print(explain(default, overrides), end="")
        else:
            print(explain(path, overrides), end="")
    print(f"{path or DEFAULT_CONFIG}: OK ({cfg.name}: {cfg.algorithm_label}, {cfg.model.name}, {cfg.data.name})")
    return 0


def _cmd_search(ns: argparse.Namespace) -> int:
    from rayfl.core.units import format_sim_time
    from rayfl.engine.search_only import run_search_only

    path, overrides = _split(ns.args)
    cfg = _load(path, overrides)
    print(
        f"rayfl: search-only {cfg.name!r}: {cfg.algorithm.name} on {cfg.model.name}, {cfg.rounds} rounds, "
        f"{cfg.clients_per_round} clients per round (no training)",
        flush=True,
    )
    result = run_search_only(cfg)
    sim_s = result.records[-1].sim_time_s if result.records else 0.0
    print(
        f"memory util {_percent(result.mean('memory_util'))} | bandwidth util {_percent(result.mean('bandwidth_util'))}"
        f" | hit rate {_percent(result.mean('hit_rate'))} | clients fitting "
        f"{_percent(result.mean('clients_run') / max(cfg.clients_per_round, 1))} | sim {format_sim_time(sim_s)}"
    )
    if result.run_dir is not None:
        print(f"results: {result.run_dir}")
    return 0


def _percent(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{100 * value:.1f}%"


def _cmd_sweep(ns: argparse.Namespace) -> int:
    from rayfl.core.errors import ConfigError
    from rayfl.tune import load_sweep, run_sweep

    resume = _sweep_folder(ns.resume) if ns.resume else None
    if resume is not None:
        from rayfl.tune.sweep import load_resumed_sweep

        if ns.file is not None or ns.overrides:
            raise ConfigError("--resume runs the sweep as it was started: give no file or overrides", file=ns.resume)
        sweep, overrides = load_resumed_sweep(resume)
    elif ns.file is None:
        raise ConfigError("give a sweep file (or --resume SWEEP_DIR)", file="rayfl sweep")
    else:
        sweep, overrides = load_sweep(ns.file, ns.overrides), list(ns.overrides)
        sweep = _sweep_outliving_job(sweep)
    print(
        f"rayfl: sweep {sweep.name!r} ({sweep.config.mode}): {len(sweep.params)} swept keys, search "
        f"{sweep.config.search}, {sweep.config.num_samples} sample(s); {len(sweep.checked)} trial configs checked",
        flush=True,
    )
    if ns.check:
        return 0
    result = run_sweep(sweep, overrides=overrides, verbose=1 if ns.verbose else 0, resume=resume)
    print(result.markdown)
    where = result.location or str(result.sweep_dir)  # a sweep on storage by URI: its URI, not the staging folder
    print(f"results: {where} ({result.wall_s:.1f} s)")
    for path in result.files:
        print(f"wrote: {where.partition('?')[0]}/{path.name}" if result.location else f"wrote: {path}")
    if result.unfinished:
        print(
            f"rayfl: sweep interrupted with {result.unfinished} trial(s) unfinished; resume with: rayfl sweep --resume "
            f"{where}",
            file=sys.stderr,
        )
        return 128 + signal.SIGINT
    return 0 if not (result.table["status"] == "error").any() else 1


def _sweep_folder(given: str) -> Path | str:
    """``--resume``'s sweep folder: a storage URI as given (``tune/sweep.py`` reads it back), else a path."""
    from rayfl.core.files import is_storage_uri

    return given if is_storage_uri(given) else Path(given)


def _sweep_outliving_job(sweep: Sweep) -> Sweep:
    """A sweep's relative output_dir under ``ray job submit``, as ``_outliving_job`` does for a run."""
    import dataclasses

    from rayfl.engine.persist.job_output import job_output_dir

    output_dir, note = job_output_dir(sweep.config.output_dir)
    if note is None:
        return sweep
    print(note, flush=True)
    return dataclasses.replace(sweep, config=dataclasses.replace(sweep.config, output_dir=output_dir))


def _cmd_data(ns: argparse.Namespace) -> int:
    from rayfl.data.shakespeare import default_cache_dir, prepare_shakespeare

    cache = Path(ns.cache_dir) if ns.cache_dir else default_cache_dir()
    out = prepare_shakespeare(cache, edition=ns.edition, seq_len=ns.seq_len)
    print(f"shakespeare ({ns.edition}) ready: {out}")
    return 0


def _cmd_report(ns: argparse.Namespace) -> int:
    from rayfl.report import report
    from rayfl.report.runs import RunFileError

    out_dir = Path(ns.out) if ns.out else None
    try:
        text, pngs = report([Path(d) for d in ns.run_dirs], out_dir, paper=True if ns.paper else None)
    except RunFileError as err:  # a damaged record file with no whole twin: one line naming it
        print(f"rayfl: error: {err}", file=sys.stderr)
        return 2
    print(text)
    for png in pngs:
        print(f"plot: {png}")
    return 0


def _cmd_export(ns: argparse.Namespace) -> int:
    from rayfl.engine.checkpoint_export import export_checkpoint
    from rayfl.engine.persist.export import exported_models

    out = Path(ns.out) if ns.out else None
    run_dir = _local_run_dir(ns.run_dir, "RUN_DIR")  # a run on a storage URI: read back into a staging folder
    written = export_checkpoint(run_dir, out)
    lines: list[tuple[Path, str]] = []
    for model in exported_models(out if out is not None else run_dir):
        if model.path in written:
            lines.append((model.path, f"model {model.model_id} ({model.name}), round {model.round_idx}, "
                                      f"test accuracy {model.accuracy:.4f}"))  # fmt: skip
    lines += [(path, "save_pretrained directory") for path in written if path.is_dir()]
    # into the run's own models/: a run on a storage URI gets them copied there, and is named by its URI
    where = _published(run_dir) if out is None else str(run_dir)
    for path, text in lines:
        shown = path if where == str(run_dir) else f"{where.partition('?')[0]}/{path.relative_to(run_dir).as_posix()}"
        print(f"{shown}: {text}")
    return 0


def _parser() -> argparse.ArgumentParser:
    from rayfl.cli_help import OVERVIEW

    parser = argparse.ArgumentParser(
        prog="rayfl", description=OVERVIEW, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    run = _command(sub, "run")
    run.add_argument("args", nargs="*", metavar="FILE | key=value")
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue a stopped run in its directory from its newest checkpoint (key=value: backend.*, checkpoint.*)",
    )
    run.set_defaults(func=_cmd_run)
    val = _command(sub, "validate")
    val.add_argument("args", nargs="+", metavar="FILE | key=value")
    val.add_argument(
        "--explain",
        action="store_true",
        help="print every resolved value and where it came from (FILE:LINE, override, default)",
    )
    val.set_defaults(func=_cmd_validate)
    search = _command(sub, "search")
    search.add_argument("args", nargs="+", metavar="FILE | key=value")
    search.set_defaults(func=_cmd_search)
    sweep = _command(sub, "sweep")
    sweep.add_argument("file", metavar="FILE", nargs="?")
    sweep.add_argument("overrides", nargs="*", metavar="key=value", help="sweep fields; base.KEY=V for the base")
    sweep.add_argument("--check", action="store_true", help="check the sweep file and every trial's config, then stop")
    sweep.add_argument(
        "--resume",
        metavar="SWEEP_DIR",
        default=None,
        help="continue an interrupted sweep in its folder (Tune's restore; trials continue from their checkpoints)",
    )
    sweep.set_defaults(func=_cmd_sweep)
    data = _command(sub, "data")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    prep = data_sub.add_parser("prepare", help="build a data set into the cache")
    prep.add_argument("dataset", choices=["shakespeare"])
    prep.add_argument("--edition", choices=["modern", "folio", "both"], default="modern")
    prep.add_argument("--seq-len", type=int, default=80)
    prep.add_argument("--cache-dir", default=None)
    prep.set_defaults(func=_cmd_data)
    rep = _command(sub, "report")
    rep.add_argument("run_dirs", nargs="+")
    rep.add_argument("--out", default=None, help="directory for report.md and PNGs (default: the first run)")
    rep.add_argument(
        "--paper",
        action="store_true",
        help="add paper 000's Table 3, utilisation bars and per-setting curves (default: when the runs come from "
        "more than one setting: config 'setting', else the folder holding the run)",
    )
    rep.set_defaults(func=_cmd_report)
    export = _command(sub, "export")
    export.add_argument("run_dir", metavar="RUN_DIR", help="the directory of a run that has checkpoints")
    export.add_argument("out", metavar="OUT", nargs="?", default=None, help="folder to write (default RUN_DIR/models)")
    export.set_defaults(func=_cmd_export)
    _add_traces_commands(sub)
    return parser


def _command(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str) -> argparse.ArgumentParser:
    """A sub-command with the words of ``cli_help``: its summary, what it does and examples."""
    import textwrap

    from rayfl.cli_help import COMMANDS

    words = COMMANDS[name]
    return sub.add_parser(
        name,
        help=words.summary,
        description=textwrap.fill(words.description, 100),
        epilog=words.epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_traces_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``rayfl traces ...``; the handlers are in ``rayfl.traces.commands`` (imported only when one runs)."""

    def run(ns: argparse.Namespace) -> int:
        from rayfl.traces.commands import run_traces_command

        return run_traces_command(ns)

    traces = _command(sub, "traces")
    tsub = traces.add_subparsers(dest="traces_command", required=True)
    rec = tsub.add_parser("record", help="sample this machine's free memory and network throughput")
    rec.add_argument("out", metavar="OUT", help="writes OUT.memory.csv, OUT.bandwidth_down.csv, ...")
    rec.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    rec.add_argument("--duration", type=float, default=60.0, help="seconds to record (default 60)")
    rec.add_argument("--note", default="", help="the load that ran meanwhile, for the '# load:' header")
    rec.add_argument("--kinds", nargs="+", default=None, metavar="KIND", help="memory gpu_memory bandwidth_down ...")
    show = tsub.add_parser("show", help="statistics of a trace file, and optionally a plot")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--plot", default=None, metavar="OUT.png", help="write a PNG of value against time")
    imp = tsub.add_parser("import", help="convert a published network log to a rayfl trace")
    imp.add_argument("format", metavar="FORMAT", help="mahimahi, pensieve or ucc")
    imp.add_argument("src", metavar="SRC", help="the log (for ucc, a CSV or ARCHIVE.zip/MEMBER.csv)")
    imp.add_argument("out", metavar="OUT")
    imp.add_argument("--direction", choices=["down", "up"], default=None)
    imp.add_argument("--window-s", type=float, default=None, help="mahimahi: seconds per throughput window")
    syn = tsub.add_parser("synth", help="write a seeded synthetic trace")
    syn.add_argument("kind", choices=["memory", "bandwidth_down", "bandwidth_up"])
    syn.add_argument("out", metavar="OUT")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    syn.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    fetch = tsub.add_parser("fetch", help="download a named real trace set into the cache (checksums pinned)")
    fetch.add_argument("name", metavar="NAME", help="a set, e.g. mahimahi-cellular (list: show them all)")
    fetch.add_argument(
        "--mirror", default=None, help="a URL or folder laid out as the source, or holding its files (no internet)"
    )
    fetch.add_argument("--cache-dir", default=None, help="default: $RAYFL_CACHE/traces or ~/.cache/rayfl/traces")
    for parser in (rec, show, imp, syn, fetch):
        parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if ns.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    from rayfl.core.errors import ConfigError, RunLostError
    from rayfl.engine.persist.write_errors import RunWriteError
    from rayfl.traces.format import TraceError

    try:
        return int(ns.func(ns))
    except (ConfigError, FileNotFoundError, TraceError) as err:
        # errors a user can cause (config, data, caches, traces, cluster address): one line, no traceback
        print(f"rayfl: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except RunLostError as err:  # Ray actors kept dying (engine/ray/recovery.py), or an in-process worker died
        # (engine/exec/workers.py): one line, no traceback
        print(f"rayfl: error: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_ACTORS_FAILED
    except RunWriteError as err:  # a full disk or a read-only directory (engine/persist/write_errors.py): one line
        print(f"rayfl: error: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    except KeyboardInterrupt as err:
        # a signal before a run's first round (SetupInterrupted: nothing written), or a second one: stopped at once (a
        # run's records are completed all the same)
        signum = getattr(err, "signum", signal.SIGINT)
        print(f"rayfl: {err or 'interrupted'}", file=sys.stderr)
        return 128 + int(signum)


if __name__ == "__main__":
    sys.exit(main())
