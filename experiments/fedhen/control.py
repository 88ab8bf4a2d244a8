"""Paper 001's complex-versus-simple control (issue 42) from the runs of ``experiments/fedhen/run_control.sh``.

python experiments/fedhen/control.py experiments/fedhen/runs-control [curves.png] > experiments/fedhen/control.md

Per run and seed, the global models' figures (the mean of the last three evaluations, ``rayfl.report.decide``) at
each horizon (``--horizons``; default round 100, the table's horizon, and round 300): the simple model alone (every
device trains it), the complex model alone (every device trains it), and FedHeN's simple and complex models (half the
devices each). Then, by the project's rule, whether the complex model is above the simple one alone and within
FedHeN, at each horizon, and what the shared training costs each model (FedHeN's model against the same model
alone). With ``--fixed`` (default ``experiments/fedhen/runs-fixeddata-3seeds``), the FedHeN runs' first 100 rounds
are checked against the fixed-data table's records, evaluation by evaluation (runs on that data set only); a second
argument draws the curves (mean over seeds, band min to max).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Callable
from pathlib import Path

import yaml

from rayfl.report.decide import spread, tail_mean, verdict

HORIZONS = (100, 300)  # default --horizons: the table's 100 rounds and the control's 300
# (label, run name in the folder, curve)
MODELS = [
    ("simple model alone", "simplealone", "simple"),
    ("complex model alone", "complexalone", "complex"),
    ("FedHeN's simple model", "fedhen", "simple"),
    ("FedHeN's complex model", "fedhen", "complex"),
]
ORDERINGS = [
    ("complex model alone above simple model alone", "complex model alone", "simple model alone"),
    ("FedHeN's complex model above its simple model", "FedHeN's complex model", "FedHeN's simple model"),
    ("FedHeN's simple model above the simple model alone", "FedHeN's simple model", "simple model alone"),
    ("FedHeN's complex model above the complex model alone", "FedHeN's complex model", "complex model alone"),
]
Curve = list[tuple[int, float]]


def _curves(run_dir: Path, key: str = "test_acc") -> dict[str, Curve]:
    """The complex model's (rounds.csv) and the simple model's (evals.csv) evaluations of ``key``, by round."""
    rounds = list(csv.DictReader((run_dir / "rounds.csv").open()))
    evals = list(csv.DictReader((run_dir / "evals.csv").open()))
    complex_ = [(int(r["round_idx"]) + 1, float(r[key])) for r in rounds if r["test_acc"] not in ("", "nan")]
    simple = [(int(r["round_idx"]) + 1, float(r[key])) for r in evals if r["name"] == "simple"]
    return {"simple": simple, "complex": complex_, "train_loss": _train_loss(rounds)}


def _train_loss(rounds: list[dict[str, str]]) -> Curve:
    """The clients' mean training loss per round (of the model they trained)."""
    return [(int(r["round_idx"]) + 1, float(r["train_loss"])) for r in rounds if r["train_loss"] not in ("", "nan")]


def _costs(run_dir: Path, horizon: int) -> tuple[float, float, float]:
    """(client updates, training GMACs, simulated seconds) over the run's first ``horizon`` rounds."""
    rounds = [r for r in csv.DictReader((run_dir / "rounds.csv").open()) if int(r["round_idx"]) < horizon]
    updates = sum(float(r["clients_run"]) for r in rounds)
    gmacs = sum(float(r["train_macs"]) for r in rounds if r["train_macs"] not in ("", "nan")) / 1e9
    return updates, gmacs, float(rounds[-1]["sim_time_s"]) if rounds else math.nan


def _by_horizon(head: str, horizons: tuple[int, ...], rows: list[tuple[str, Callable[[int], str]]]) -> None:
    """A markdown table: one row per ``(label, cell)``, one column per horizon (``cell(h)``), then a blank line."""
    print(f"| {head} | " + " | ".join(f"round {h}" for h in horizons) + " |")
    print("|---|" + "---|" * len(horizons))
    for label, cell in rows:
        print(f"| {label} | " + " | ".join(cell(h) for h in horizons) + " |")
    print()


def _verdict_cell(a: list[float], b: list[float]) -> str:
    word, gap, bar = verdict(a, b)
    return f"{gap:+.3f} vs {bar:.3f}: **{word}**" if not math.isnan(gap) else word


def _cost_cell(run_dirs: list[Path], horizon: int) -> str:
    got = [_costs(d, horizon) for d in run_dirs]
    mean = [sum(c[i] for c in got) / len(got) for i in range(3)] if got else [math.nan] * 3
    return f"{mean[0]:,.0f} updates, {mean[1]:,.1f} GMACs, {mean[2]:.2f} s"


def _losses(run_dir: Path, curve: str, horizon: int) -> tuple[float, float]:
    """(training loss over the ten rounds up to ``horizon``, test loss as the mean of its last three evaluations)."""
    train = [loss for round_no, loss in _curves(run_dir)["train_loss"] if horizon - 10 < round_no <= horizon]
    test = _at(_curves(run_dir, "test_loss")[curve], horizon)
    return sum(train) / len(train), test


def _at(curve: Curve, horizon: int) -> float:
    return tail_mean([acc for round_no, acc in curve if round_no <= horizon])


def _runs(folder: Path) -> dict[tuple[str, int], Path]:
    found = {}
    for config in sorted(folder.glob("*/config.yaml")):
        cfg = yaml.safe_load(config.read_text())
        name = str(cfg["name"])  # iid-<run>-s<seed>
        found[(name.split("-")[1], int(cfg["seed"]))] = config.parent
    return found


def _same_start(run_dir: Path, fixed_dir: Path) -> str:
    """Whether the FedHeN run's evaluations up to round 100 are the fixed-data table's run's, to the last digit."""
    if not (fixed_dir / "evals.csv").exists():
        return "no record to compare"
    ours, theirs_cfg = (yaml.safe_load((d / "config.yaml").read_text())["data"] for d in (run_dir, fixed_dir))
    if ours["name"] != theirs_cfg["name"]:
        return f"no record on {ours['name']}"
    mine = (run_dir / "evals.csv").read_text().splitlines()
    theirs = (fixed_dir / "evals.csv").read_text().splitlines()
    same = mine[: len(theirs)] == theirs
    rounds_mine = [r for r in csv.DictReader((run_dir / "rounds.csv").open()) if int(r["round_idx"]) < 100]
    rounds_theirs = list(csv.DictReader((fixed_dir / "rounds.csv").open()))
    same_acc = [r["test_acc"] for r in rounds_mine] == [r["test_acc"] for r in rounds_theirs]
    return "identical" if same and same_acc else "differ"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", type=Path)
    parser.add_argument("curves", type=Path, nargs="?")
    parser.add_argument("--fixed", type=Path, default=Path("experiments/fedhen/runs-fixeddata-3seeds"))
    parser.add_argument("--horizons", type=int, nargs="+", default=list(HORIZONS))
    args = parser.parse_args()
    horizons = tuple(args.horizons)

    runs = _runs(args.runs)
    seeds = sorted({seed for _, seed in runs})
    curves: dict[str, list[Curve]] = {}
    for label, run, curve in MODELS:
        curves[label] = [_curves(runs[(run, seed)])[curve] for seed in seeds if (run, seed) in runs]
    figures = {(label, h): [_at(c, h) for c in curves[label]] for label, _, _ in MODELS for h in horizons}

    print("# Paper 001: the complex model against the simple one, alone and within FedHeN (issue 42)\n")
    data = yaml.safe_load(next(iter(runs.values())).joinpath("config.yaml").read_text())["data"]["name"]
    extra = "" if horizons == HORIZONS else " --horizons " + " ".join(map(str, horizons))
    print(
        f"`PYTHONPATH=$PWD python experiments/fedhen/control.py {args.runs}{extra}`; the runs: "
        f"`bash experiments/fedhen/run_control.sh` (IID setting on `{data}`, `data.seed=0`, {horizons[-1]} rounds; "
        'README, "Complex against simple").\n'
    )
    print(
        "Figure per run: the mean of the last three evaluations up to the horizon (global models, test accuracy; "
        "chance 0.10); verdicts by the project's rule (gap of the seed means over twice the larger seed range). "
        f"Seeds {seeds}.\n"
    )
    header = "| model | " + " | ".join(f"round {h}: per seed | mean | range" for h in horizons) + " |"
    print(header)
    print("|---|" + "---|---:|---:|" * len(horizons))
    for label, _, _ in MODELS:
        cells = []
        for h in horizons:
            mean, rng = spread(figures[(label, h)])
            cells += [" / ".join(f"{v:.3f}" for v in figures[(label, h)]), f"{mean:.3f}", f"{rng:.3f}"]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    _by_horizon(
        "ordering",
        horizons,
        [(text, lambda h, a=a, b=b: _verdict_cell(figures[(a, h)], figures[(b, h)])) for text, a, b in ORDERINGS],
    )
    print(
        "Cost per run up to each horizon (mean over the seeds): client updates, training GMACs (the engine's count: "
        "one pass of the client's own model per sample), simulated seconds:\n"
    )
    costs = (("simple alone", "simplealone"), ("complex alone", "complexalone"), ("FedHeN", "fedhen"))
    _by_horizon(
        "run",
        horizons,
        [
            (label, lambda h, run=run: _cost_cell([runs[(run, s)] for s in seeds if (run, s) in runs], h))
            for label, run in costs
        ],
    )
    print(
        "Each model alone: the clients' training loss (mean over the ten rounds up to the horizon) against the test "
        "loss (mean of the last three evaluations), per seed (train / test):\n"
    )
    pairs = [(label, run, curve) for label, run, curve in MODELS[:2]]
    _by_horizon(
        "model",
        horizons,
        [
            (
                label,
                lambda h, run=run, curve=curve: ", ".join(
                    "{:.3f} / {:.3f}".format(*_losses(runs[(run, s)], curve, h)) for s in seeds if (run, s) in runs
                ),
            )
            for label, run, curve in pairs
        ],
    )
    checks = [
        f"seed {seed}: {_same_start(runs[('fedhen', seed)], args.fixed / f'iid-fedhen-s{seed}')}"
        for seed in seeds
        if ("fedhen", seed) in runs
    ]
    print(
        f"FedHeN's first 100 rounds against the fixed-data table's records ({args.fixed}): " + "; ".join(checks) + "."
    )
    if args.curves:
        _plot(curves, args.curves, horizons[0])


def _plot(curves: dict[str, list[Curve]], path: Path, mark: int) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for label, _, _ in MODELS:
        group = [c for c in curves[label] if c]
        if not group:
            continue
        length = min(len(c) for c in group)
        xs = [group[0][i][0] for i in range(length)]
        ys = [[c[i][1] for c in group] for i in range(length)]
        style = "-" if "alone" in label else "--"
        (line,) = ax.plot(xs, [sum(y) / len(y) for y in ys], style, label=label)
        ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=line.get_color(), alpha=0.15)
    ax.axvline(mark, color="grey", lw=0.8)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (global model)")
    ax.legend(fontsize=8)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()
