"""``rayfl`` command line: parse, build, run. No logic beyond wiring.

rayfl run [FILE] [key=value ...]      run an experiment (no FILE: the embedded default)
rayfl validate FILE [key=value ...]   check a config without running it
rayfl data prepare shakespeare        build the embedded default data set into the cache
rayfl report RUN_DIR [RUN_DIR ...]    markdown table and accuracy plot of finished runs
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from importlib import resources
from pathlib import Path

__all__ = ["DEFAULT_CONFIG", "main"]

DEFAULT_CONFIG = "default.yaml"


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    """The first argument is the config file unless it is already an override (contains '=')."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _load(path: str | None, overrides: list[str]):  # type: ignore[no-untyped-def]
    from rayfl.config_loader import load_config

    if path is None:
        with resources.as_file(resources.files("rayfl.configs") / DEFAULT_CONFIG) as default:
            return load_config(default, overrides)
    return load_config(path, overrides)


def _cmd_run(ns: argparse.Namespace) -> int:
    from rayfl.engine.driver import run_experiment
    from rayfl.engine.progress import ProgressLine
    from rayfl.report import report

    path, overrides = _split(ns.args)
    cfg = _load(path, overrides)
    print(
        f"rayfl: running {cfg.name!r}: {cfg.algorithm.name} on {cfg.data.name}, {cfg.rounds} rounds, "
        f"{cfg.clients_per_round} clients per round, backend {cfg.backend.kind}",
        flush=True,
    )
    result = run_experiment(cfg, callbacks=[ProgressLine(sys.stdout, cfg.rounds)])
    acc, base = result.final_eval.accuracy, result.baseline_acc
    print(
        f"final test accuracy {100 * acc:.2f}% (most-frequent-label baseline {100 * base:.2f}%) "
        f"on {result.final_eval.num_samples} test samples"
    )
    if result.run_dir is not None:
        _, pngs = report([result.run_dir], result.run_dir)
        print(f"results: {result.run_dir}")
        for png in pngs:
            print(f"plot: {png}")
    return 0 if math.isfinite(acc) else 1


def _cmd_validate(ns: argparse.Namespace) -> int:
    path, overrides = _split(ns.args)
    cfg = _load(path, overrides)
    print(f"{path or DEFAULT_CONFIG}: OK ({cfg.name}: {cfg.algorithm.name}, {cfg.model.name}, {cfg.data.name})")
    return 0


def _cmd_data(ns: argparse.Namespace) -> int:
    from rayfl.data.shakespeare import default_cache_dir, prepare_shakespeare

    cache = Path(ns.cache_dir) if ns.cache_dir else default_cache_dir()
    out = prepare_shakespeare(cache, edition=ns.edition, seq_len=ns.seq_len)
    print(f"shakespeare ({ns.edition}) ready: {out}")
    return 0


def _cmd_report(ns: argparse.Namespace) -> int:
    from rayfl.report import report

    out_dir = Path(ns.out) if ns.out else None
    text, pngs = report([Path(d) for d in ns.run_dirs], out_dir)
    print(text)
    for png in pngs:
        print(f"plot: {png}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rayfl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment")
    run.add_argument("args", nargs="*", metavar="FILE | key=value")
    run.set_defaults(func=_cmd_run)
    val = sub.add_parser("validate", help="check a config without running it")
    val.add_argument("args", nargs="+", metavar="FILE | key=value")
    val.set_defaults(func=_cmd_validate)
    data = sub.add_parser("data", help="data sets")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    prep = data_sub.add_parser("prepare", help="build a data set into the cache")
    prep.add_argument("dataset", choices=["shakespeare"])
    prep.add_argument("--edition", choices=["modern", "folio", "both"], default="modern")
    prep.add_argument("--seq-len", type=int, default=80)
    prep.add_argument("--cache-dir", default=None)
    prep.set_defaults(func=_cmd_data)
    rep = sub.add_parser("report", help="tables and plots of finished runs")
    rep.add_argument("run_dirs", nargs="+")
    rep.add_argument("--out", default=None, help="directory for report.md and PNGs (default: the first run)")
    rep.set_defaults(func=_cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if ns.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    from rayfl.config_loader import ConfigError

    try:
        return int(ns.func(ns))
    except (ConfigError, FileNotFoundError) as err:
        print(f"rayfl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
