"""FedTrans beside HeteroFL and FedAvg at CPU size, with paper 002's protocol and figures (Sec. 5.1-5.2, Table 2).

    PYTHONPATH=$PWD python experiments/fedtrans/run_table.py [--config cpu.yaml] [--seeds 0 1 2] [--rounds 150]
        [--ablations]

Per seed, with the same data, budgets and training set-up (``--config``: ``cpu.yaml``, the CIFAR-like setting, or
``femnist.yaml``, the FEMNIST-shaped writers):

* **FedTrans** grows its family from HeteroFL's conv net;
* **HeteroFL** trains the largest model FedTrans grew (its transformation log, read from the FedTrans run's
  ``summary.json``: the paper gives its baselines "the largest model transformed by FedTrans"), each client the
  largest of HeteroFL's rates whose sub-model's training FLOPs fit its compute budget, with HeteroFL's scaler, static
  batch norm and label masking; every client is scored on the sub-model it can train (``eval_widths``);
* **SplitMix** trains 8 base models of 1/8 the width of that largest model (``model.name: ensemble``), each client as
  many as fit its compute budget; each client is scored on the mix of the bases it can train (``eval_widths``);
* **FLuID** trains that largest model; clients whose compute budget it misses are stragglers and train invariant-
  dropout sub-models of 0.95 ... 0.5 of it (those that fit none fail, recorded);
* **FedAvg** trains the initial model, which every client can train.

With ``--ablations``, the first seed also runs FedTrans without soft aggregation (each model averages its own
clients: paper Table 3's "-s"), with large-to-small sharing (Table 1's "l2s") and with the paper's literal crop
(``rescale_cropped: false``, "crop": a parent's input columns added into its widened child's at full scale).

Writes ``results.md`` (per seed and mean over seeds: average client accuracy, its interquartile range, each model's
accuracy, models, total training MACs, network volume; the ablations; and Table 2's CIFAR-10 rows),
``client_accuracy.png`` (the clients' accuracies at the end, per method, first seed) and ``accuracy_vs_macs.png``
(average client accuracy against cumulative training MACs, paper Figure 7); for another config than ``cpu.yaml`` the
names carry its stem (``results_femnist.md``, ...), or ``--tag``'s name; ``--set KEY=VALUE`` (repeatable) adds an
override to every run (a variant of a setting without a copy of its config). Runs go to
``runs/fedtrans[-STEM]/seed<S>/``; with ``--records DIR`` each finished run's records (``rounds.csv``, ``evals.csv``,
``client_accs.csv``, ``config.yaml``, ``summary.json``) are copied to ``DIR/seed<S>/<method>/``, and ``--from-records
DIR`` writes the tables from such a copy without running anything (``experiments/fedtrans/records/``, committed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rayfl.config.model import CellNetConfig, EnsembleConfig
from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.common.widths import HETEROFL_RATES
from rayfl.fl.methods.fluid.config import FLuIDConfig
from rayfl.fl.methods.splitmix.config import SplitMixConfig
from rayfl.report import load_run, plot_client_accuracy
from rayfl.report.runs import RunRecords
from rayfl.report.tables import cost_table

HERE = Path(__file__).resolve().parent
METHODS = ("fedtrans", "heterofl", "splitmix", "fluid", "fedavg")
RECORDS = ("rounds.csv", "evals.csv", "client_accs.csv", "config.yaml", "summary.json")
BASES = 8  # SplitMix's base models, each 1/8 of the largest model's width (the authors' default atom_slim_ratio)
PAPER = """Paper 002, Table 2 (100 clients per round, mean of 3 runs; CIFAR-10 from MobileNetV3-small, FEMNIST from
NAS-Bench-201's smallest model):

| Data | Method | Avg. client acc (%) | IQR (%) | Cost (PMACs) | Network (MB) |
|---|---|---:|---:|---:|---:|
| CIFAR-10 | FedTrans | 78.29 | 5.25 | 0.86 | 1368.4 |
| CIFAR-10 | HeteroFL | 64.51 | 7.00 | 4.31 | 1828.4 |
| FEMNIST | FedTrans | 76.42 | 13.23 | 0.10 | 8.9 |
| FEMNIST | HeteroFL | 61.54 | 13.50 | 0.78 | 209.0 |
"""


def _run(
    config: Path, overrides: list[str], out: Path, edit: Callable[[ExperimentConfig], ExperimentConfig] | None = None
) -> Path:
    cfg = load_config(config, [f"output_dir={out}", *overrides])
    if edit is not None:
        cfg = edit(cfg)
    done = out / cfg.name
    summary = done / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("status") == "finished":
        logging.info("%s: reused", done)  # a finished run of an earlier call (delete it to re-run); an interrupted
        return done  # one also writes a summary, and is run again
    began = time.perf_counter()
    result = run_experiment(cfg)
    assert result.run_dir is not None
    logging.info("%s: %.0f s", result.run_dir, time.perf_counter() - began)
    return result.run_dir


def resolve_config(name: str) -> Path:
    """A config of ``experiments/fedtrans/`` by name, or a path."""
    return HERE / name if (HERE / name).is_file() else Path(name)


def quiet_logging() -> None:
    """The scripts' logging: one line per run, the engine's per-round lines off."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("rayfl.engine").setLevel(logging.WARNING)


def heterofl_overrides(largest: list[str], clip: float | None = None) -> list[str]:
    """HeteroFL as the table runs it: on FedTrans's largest model (``largest``, its transformation log; App. A.1),
    with HeteroFL's scaler, evaluated at each of its rates as well; ``clip`` replaces its authors' gradient clipping
    (``algorithm.grad_clip_norm``, 1 by default; 0: none, the other methods' default)."""
    overrides = [
        "algorithm.name=heterofl",
        "model.scaler=true",
        f"model.transforms={json.dumps(largest)}",
        f"eval_widths={json.dumps(sorted(HETEROFL_RATES))}",
    ]
    return overrides if clip is None else [*overrides, f"algorithm.grad_clip_norm={clip}"]


def run_plans(config: Path, plans: dict[str, list[str]], out: Path, seed: int, records: Path) -> dict[str, Path]:
    """Each named run of ``plans`` (its overrides), in order, under ``out``; each run's records are copied to
    ``records`` as soon as it ends (``copy_records``), so a cut session keeps what finished."""
    done: dict[str, Path] = {}
    for name, overrides in plans.items():
        done[name] = _run(config, [*overrides, f"name={name}"], out)
        copy_records({seed: {name: done[name]}}, records)
    return done


def ablation_args(parser: argparse.ArgumentParser, runs: str, records: str) -> argparse.Namespace:
    """The ablation scripts' shared options (``--runs``, ``--records`` under ``records/``, ``--from-records``,
    ``--out``), parsed, with ``quiet_logging``."""
    parser.add_argument("--runs", type=Path, default=Path(runs))
    parser.add_argument("--records", type=Path, default=HERE / "records" / records)
    parser.add_argument("--from-records", type=Path, default=None, help="the table from copied records; runs nothing")
    parser.add_argument("--out", type=Path, default=HERE / "issue24")
    args = parser.parse_args()
    quiet_logging()
    return args


def run_seed(
    config: Path,
    seed: int,
    rounds: int,
    root: Path,
    methods: tuple[str, ...] = METHODS,
    extra: tuple[str, ...] = (),
    heterofl_clip: float | None = None,
) -> dict[str, Path]:
    """Every method of ``methods`` on one seed (FedTrans always: the baselines take its largest model), each with the
    overrides ``extra`` (``--set``) as well, HeteroFL with ``heterofl_clip`` (``heterofl_overrides``)."""
    out = root / f"seed{seed}"
    common = [f"seed={seed}", f"rounds={rounds}", *extra]
    dirs = {"fedtrans": _run(config, [*common, "name=fedtrans"], out)}
    family = json.loads((dirs["fedtrans"] / "summary.json").read_text())["fedtrans"]["models"]
    if "heterofl" in methods:
        dirs["heterofl"] = _run(config, [*common, "name=heterofl", *heterofl_overrides(family[-1], heterofl_clip)], out)

    def splitmix(cfg: ExperimentConfig) -> ExperimentConfig:
        base = dataclasses.replace(cfg.model, transforms=tuple(family[-1]))
        assert isinstance(base, CellNetConfig)
        model = EnsembleConfig(base=base, members=BASES, width=1.0 / BASES)
        widths = tuple(n / BASES for n in range(1, BASES + 1))
        return dataclasses.replace(cfg, name="splitmix", model=model, algorithm=SplitMixConfig(), eval_widths=widths)

    def fluid(cfg: ExperimentConfig) -> ExperimentConfig:
        model = dataclasses.replace(cfg.model, transforms=tuple(family[-1]))
        return dataclasses.replace(cfg, name="fluid", model=model, algorithm=FLuIDConfig())

    if "splitmix" in methods:
        dirs["splitmix"] = _run(config, common, out, splitmix)
    if "fluid" in methods:
        dirs["fluid"] = _run(config, common, out, fluid)
    if "fedavg" in methods:
        dirs["fedavg"] = _run(config, [*common, "name=fedavg", "algorithm.name=fedavg"], out)
    return dirs


def copy_records(seeds: dict[int, dict[str, Path]], records: Path) -> None:
    """Each run's records (``RECORDS``) to ``records/seed<S>/<method>/``."""
    for seed, dirs in seeds.items():
        for method, run_dir in dirs.items():
            target = records / f"seed{seed}" / method
            target.mkdir(parents=True, exist_ok=True)
            for name in RECORDS:
                if (run_dir / name).is_file():
                    shutil.copy2(run_dir / name, target / name)


def from_records(records: Path) -> dict[int, dict[str, Path]]:
    """The seeds and methods of a ``copy_records`` directory (methods missing for a seed are left out)."""
    seeds: dict[int, dict[str, Path]] = {}
    for seed_dir in sorted(records.glob("seed*")):
        dirs = {m: seed_dir / m for m in METHODS if (seed_dir / m / "summary.json").is_file()}
        if dirs:
            seeds[int(seed_dir.name.removeprefix("seed"))] = dirs
    return seeds


def _iqr(run: RunRecords) -> float:
    rows = run.client_accs()
    assert rows is not None
    q1, q3 = rows["test_acc"].astype(float).quantile([0.25, 0.75])
    return 100.0 * float(q3 - q1)


def mean_table(seeds: dict[int, dict[str, Path]]) -> str:
    """Mean (and range) over seeds of the headline figures."""
    lines = [
        "| Method | Avg. client acc (%) | IQR (%) | Models | Train GMACs | Network MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for method in METHODS:
        runs = [load_run(dirs[method]) for dirs in seeds.values() if method in dirs]
        if not runs:
            continue
        acc = [100.0 * (r.final_client_acc or float("nan")) for r in runs]
        iqr = [_iqr(r) for r in runs]
        models = [r.num_models or 1 for r in runs]
        macs = [(r.total_train_macs or 0.0) / 1e9 for r in runs]
        net = [(r.total_bytes or 0) / 1e6 for r in runs]

        def fmt(values: list[float], spec: str) -> str:
            text = format(statistics.fmean(values), spec)
            return text if len(values) == 1 else f"{text} ({format(min(values), spec)}-{format(max(values), spec)})"

        name = f"{method} ({len(runs)} seeds: {' / '.join(f'{a:.2f}' for a in acc)})"
        lines.append(
            f"| {name} | {fmt(acc, '.2f')} | {fmt(iqr, '.2f')} | {fmt(models, '.1f')} | {fmt(macs, '.0f')} | "
            f"{fmt(net, '.0f')} |"
        )
    return "\n".join(lines) + "\n"


def converged_at(run: RunRecords) -> str:
    """Paper 002's convergence rule on the evaluated rounds (every 10 here): the first evaluation whose average
    client accuracy is no more than 1 point above the one 10 rounds before, with that accuracy; "not met" if none."""
    rounds = run.rounds
    acc = pd.to_numeric(rounds["client_acc"])
    keep = acc.notna()
    idx, values = pd.to_numeric(rounds["round_idx"])[keep].tolist(), (100.0 * acc[keep]).tolist()
    for k in range(1, len(values)):
        if idx[k] - idx[k - 1] == 10 and values[k] - values[k - 1] <= 1.0:
            return f"round {int(idx[k])} ({values[k]:.2f} %)"
    return "not met"


def plot_accuracy_vs_macs(runs: dict[str, RunRecords], out_png: Path) -> Path:
    """Average client accuracy (evaluated rounds) against the training MACs spent so far, one line per method."""
    figure = Figure(figsize=(6.5, 4.2), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    for method, run in runs.items():
        rounds = run.rounds
        spent = pd.to_numeric(rounds["train_macs"]).cumsum() / 1e9
        acc = pd.to_numeric(rounds["client_acc"])
        keep = acc.notna()
        axes.plot(spent[keep], 100.0 * acc[keep], marker="o", markersize=3, label=method)
    axes.set_xlabel("Cumulative training GMACs")
    axes.set_ylabel("Average client accuracy (%)")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(out_png, format="png")
    return out_png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu.yaml", help="a config in experiments/fedtrans/ (or a path)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--runs", type=Path, default=None, help="default: runs/fedtrans[-STEM]")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--ablations", action="store_true")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), help="default: all")
    parser.add_argument("--records", type=Path, default=None, help="copy every run's records here")
    parser.add_argument("--from-records", type=Path, default=None, help="tables from copied records; runs nothing")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument("--tag", default=None, help="the output names' suffix (default: the config's stem)")
    parser.add_argument(
        "--heterofl-clip",
        type=float,
        default=None,
        help="HeteroFL's algorithm.grad_clip_norm (default: its authors' 1; 0: no clipping, as the other methods)",
    )
    args = parser.parse_args()
    quiet_logging()
    config = resolve_config(args.config)
    tag = f"_{args.tag}" if args.tag else "" if config.stem == "cpu" else f"_{config.stem}"
    sets = "".join(f" --set {o}" for o in args.set) + (f" --tag {args.tag}" if args.tag else "")
    sets += "" if args.heterofl_clip is None else f" --heterofl-clip {args.heterofl_clip:g}"
    runs_root = args.runs or Path("runs/fedtrans" + tag.replace("_", "-"))
    if args.from_records is not None:
        seeds = from_records(args.from_records)
        args.seeds = sorted(seeds)
        args.rounds = load_run(seeds[args.seeds[0]]["fedtrans"]).rounds_run  # the records' cap, not the default
    else:
        seeds = {}
        for seed in args.seeds:
            seeds[seed] = run_seed(
                config, seed, args.rounds, runs_root, tuple(args.methods), tuple(args.set), args.heterofl_clip
            )
            if args.records is not None:
                copy_records({seed: seeds[seed]}, args.records)
    ablations = " --ablations" if args.ablations else ""
    sections = [
        "# FedTrans beside HeteroFL, SplitMix, FLuID and FedAvg at CPU size",
        "",
        f"`PYTHONPATH=$PWD python experiments/fedtrans/run_table.py --config {config.name} --seeds "
        f"{' '.join(map(str, args.seeds))} --rounds {args.rounds}{sets}{ablations}` (setting: `{config.name}`; see "
        "`README.md`).",
        "",
        f"## Mean over seeds {', '.join(map(str, args.seeds))}",
        "",
        mean_table(seeds),
    ]
    for seed, dirs in seeds.items():
        runs = [load_run(dirs[m]) for m in METHODS if m in dirs]
        summary = json.loads((dirs["fedtrans"] / "summary.json").read_text())["fedtrans"]
        flops = summary["train_flops_per_sample"]
        sections += [f"## Seed {seed}", "", cost_table(runs)]
        sections += [
            "Paper 002's convergence rule (no more than 1 point over 10 rounds) first met at: "
            + "; ".join(f"{m} {converged_at(load_run(dirs[m]))}" for m in METHODS if m in dirs),
            "",
            "FedTrans's models (transformation logs):",
            "",
        ]
        sections += [
            f"- model {k}: `{list(log)}`, {flops[k] / 3e6:.2f} MFLOPs forward per sample ({flops[k] / flops[0]:.1f}x)"
            for k, log in enumerate(summary["models"])
        ]
        sections += ["", "Transformations (which cells, widened or deepened, at the parent's DoC):", ""]
        sections += [
            f"- after round {t['round_idx']}: model {t['child']} from {t['parent']}, "
            + ("forced" if t["doc"] is None else f"DoC {t['doc']:.5f}")
            + f": {', '.join(t['steps'])}"
            for t in summary["transformations"]
        ]
        sections.append("")
    first = seeds[args.seeds[0]]
    if args.ablations:
        seed, out = args.seeds[0], runs_root / f"seed{args.seeds[0]}"
        common = [f"seed={seed}", f"rounds={args.rounds}", *args.set]
        variants = {
            "fedtrans-s": ["algorithm.soft_aggregation=false"],
            "fedtrans-l2s": ["algorithm.share_large_to_small=true"],
            "fedtrans-crop": ["algorithm.rescale_cropped=false"],
        }
        dirs = [first["fedtrans"], *(_run(config, [*common, f"name={n}", *o], out) for n, o in variants.items())]
        sections += [f"## Ablations (seed {seed})", "", cost_table([load_run(d) for d in dirs])]
    runs = {m: load_run(first[m]) for m in METHODS if m in first}
    clients_png, macs_png = f"client_accuracy{tag}.png", f"accuracy_vs_macs{tag}.png"
    plot_client_accuracy(list(runs.values()), args.out / clients_png, labels=list(runs))
    plot_accuracy_vs_macs(runs, args.out / macs_png)
    sections += [PAPER, f"![clients]({clients_png})", "", f"![accuracy vs MACs]({macs_png})", ""]
    (args.out / f"results{tag}.md").write_text("\n".join(sections))


if __name__ == "__main__":
    main()
