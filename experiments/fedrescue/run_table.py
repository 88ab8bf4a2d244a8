"""FedResCuE vs FedSlim vs FjORD vs HeteroFL, and paper 004's ablations FedSeq and FedRush, under unstable links
(paper 004, Sec. 5.4 and 5.6), CPU-sized.

Runs experiments/fedrescue/cpu.yaml once per method, error rate (er per column, constant; 0 = links that never lose a
column) and seed, one run after another, seed by seed (so that an interrupted sweep leaves whole seeds). The engine
evaluates the global model's x0.25 ... x1 sub-models (first-k, batch statistics) every evaluated round
(``eval_widths``, evals.csv). Every run's figures go to a JSON file as soon as it finishes (``--runs``; a run already
there is not run again), and from it the script writes the table (``--out``), each width's accuracy against rounds
(``--curves``) and the mean accuracy over widths against the MB moved (``--bytes-plot``). Every method pads locally
(Eq. 5), as in the paper.

    python experiments/fedrescue/run_table.py [--rounds N] [--seeds 0 1 2] [--methods FedResCuE ...]
        [--runs runs.json] [--out results.md] [--curves curves.png] [--bytes-plot bytes.png] [--table-only]

``--table-only`` runs nothing and tabulates what runs.json holds (by default every seed in it). The table, the
curves and the bytes plot show the methods that have, for some seed, a run at every error rate, and use only the
seeds that are complete, a run for every shown method and error rate; a partial seed is named under the table with
the runs it has. With several seeds every number is the mean over them (accuracy also with its range over seeds,
max - min).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rayfl.config.sections import ResourceConfig
from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from rayfl.fl.methods.fedrescue.config import FedResCuEConfig, FedRushConfig, FedSeqConfig
from rayfl.fl.methods.fedslim.config import FedSlimConfig
from rayfl.fl.methods.fjord.config import FjORDConfig
from rayfl.fl.methods.fjord004.config import FjORD004Config
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.report.decide import tail_mean, verdict

HERE = Path(__file__).parent
CAPACITIES = (0.25, 0.5, 0.75, 1.0)
ERROR_RATES = (0.0, 0.1, 0.2)
WIDTHS = [f"x{p:g}" for p in CAPACITIES]
RECENT = 5  # a run's accuracy: the mean over its last RECENT evaluations (one evaluation is noisy)
EQUAL = "-x2"  # a label ending in this runs its method with train.steps_per_batch 2 (the equal-updates control)
S_LABEL = re.compile(r"^(?P<method>.+)-S(?P<s>\d+)$")  # "FedSlim-S2": the method with num_ratios (S) = 2
PAPER_OPTIMIZER = {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}  # paper 004, Table 17


def methods(base: FedResCuEConfig) -> dict[str, Any]:
    nested = {"capacities": base.capacities, "ratios": base.ratios, "num_ratios": base.num_ratios}
    return {
        "FedResCuE": base,
        "FedSlim": FedSlimConfig(**nested),
        "FjORD": FjORDConfig(widths=CAPACITIES, kd=True),
        "HeteroFL": HeteroFLConfig(rates=tuple(reversed(CAPACITIES)), label_mask=False, static_bn=False),
        "FedSeq": FedSeqConfig(**nested),
        "FedRush": FedRushConfig(**nested, alpha=base.alpha),
        # paper 004's FjORD (Algorithm 4): S widths below the client's own besides the whole model, so S = 3 here
        # makes as many sub-model passes per batch as FedResCuE's and FedSlim's S = 4 (their last ratio is 1)
        "FjORD-004": FjORD004Config(capacities=base.capacities, ratios=base.ratios, num_ratios=base.num_ratios - 1),
    }


def resolve(label: str, catalogue: dict[str, Any]) -> tuple[str, Any, int]:
    """A label's method name, algorithm config and optimizer steps per batch: ``-x2`` at the end gives 2 steps, and
    ``-S<n>`` before it sets the method's ``num_ratios`` (S) to n."""
    steps = 2 if label.endswith(EQUAL) else 1
    method = label.removesuffix(EQUAL)
    match = S_LABEL.match(method)
    if match is None or match["method"] not in catalogue:
        return method, catalogue.get(method), steps
    algorithm = catalogue[match["method"]]
    if not hasattr(algorithm, "num_ratios"):
        return method, None, steps
    return method, dataclasses.replace(algorithm, num_ratios=int(match["s"])), steps


def run_key(label: str, er: float, seed: int) -> str:
    return f"{label}/er{er:g}/seed{seed}"


def summarise(result: Any, wall_s: float) -> dict[str, Any]:
    """What the table and plots need of one run: each width's accuracy per evaluated round (1-based) with the MB
    moved (down + up) up to that round, final accuracies, MB down and up, uploads lost, wall seconds."""
    moved = np.cumsum([(r.bytes_down + r.bytes_up) / 1e6 for r in result.records])
    curves = {w: [[e.round_idx + 1, e.test_acc] for e in result.evals if e.name == w] for w in WIDTHS}
    rounds = [r for r, _ in curves[WIDTHS[-1]]]
    return {
        "final": [curves[w][-1][1] for w in WIDTHS],
        "curves": curves,
        "mb_moved": [float(moved[r - 1]) for r in rounds],
        "mb_down": sum(r.bytes_down for r in result.records) / 1e6,
        "mb_up": sum(r.bytes_up for r in result.records) / 1e6,
        "uploads_lost": sum(r.clients_failed for r in result.records),
        "wall_s": wall_s,
        "updates": sum(r.clients_run for r in result.records),
        "train_gmacs": sum(r.train_macs for r in result.records) / 1e9,
        "sim_s": max((r.sim_time_s for r in result.records), default=0.0),
    }


def complete_seeds(
    runs: dict[str, Any], labels: list[str], seeds: list[int], ers: tuple[float, ...] = ERROR_RATES
) -> tuple[list[str], list[int]]:
    """The methods with a run at every error rate for some seed, and the seeds with a run for each of them at every
    error rate."""
    shown = [lb for lb in labels if any(all(run_key(lb, er, s) in runs for er in ers) for s in seeds)]
    whole = [s for s in seeds if all(run_key(lb, er, s) in runs for lb in shown for er in ers)]
    return shown, whole


def recent(run: dict[str, Any]) -> list[float]:
    """Each width's accuracy averaged over the run's last ``RECENT`` evaluations."""
    return [float(np.mean([a for _, a in run["curves"][w]][-RECENT:])) for w in WIDTHS]


def _range(x: np.ndarray) -> str:
    return f"[{x.min():+.3f}, {x.max():+.3f}]"


def table(
    runs: dict[str, Any],
    labels: list[str],
    seeds: list[int],
    rounds: int,
    command: str,
    ers: tuple[float, ...] = ERROR_RATES,
    setting: str = "cpu.yaml",
    decide: bool = False,
) -> str:
    shown, whole = complete_seeds(runs, labels, seeds, ers)
    partial = [s for s in seeds if s not in whole]
    lines = [
        f"# FedResCuE vs baselines under unstable links ({rounds} rounds, `{HERE.name}/{setting}`, "
        f"seeds {', '.join(map(str, whole))})",
        "",
        "Produced by (the runs' figures are in the `--runs` file; `--table-only` rewrites this file from it without",
        "running)",
        "",
        f"    {command}",
        "",
        f"Accuracy of the global model's x p sub-models on the 1000 test images, averaged over the run's last {RECENT}",
        "`eval_widths` evaluations, mean over the seeds with the range over seeds (max - min) in brackets; `mean` is",
        "the mean over the four widths (its range over seeds in brackets). er is the constant loss probability of",
        "each column (1/8 of the network) in each direction; every method pads locally (Eq. 5). MB moved over the run",
        f"(down, up, as sent: delivered columns plus the lost one); client-rounds (of {5 * rounds}) whose whole",
        "upload was lost; wall seconds per run on a shared 2-core machine under load (not a timing figure).",
        "",
        "| method | er | x0.25 | x0.5 | x0.75 | x1 | mean | MB down | MB up | uploads lost | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    acc: dict[tuple[str, float], np.ndarray] = {}  # seeds x widths
    for er in ers:
        for label in shown:
            got = [runs[run_key(label, er, s)] for s in whole]
            if not got:
                continue
            a = acc[(label, er)] = np.asarray([recent(g) for g in got])
            per_seed = a.mean(axis=1)
            cells = " | ".join(f"{m:.3f} ({r:.3f})" for m, r in zip(a.mean(axis=0), np.ptp(a, axis=0), strict=True))
            lines.append(
                f"| {label} | {er:g} | {cells} | {per_seed.mean():.3f} ({np.ptp(per_seed):.3f}) | "
                f"{np.mean([g['mb_down'] for g in got]):.2f} | {np.mean([g['mb_up'] for g in got]):.2f} | "
                f"{np.mean([g['uploads_lost'] for g in got]):.1f} | {np.mean([g['wall_s'] for g in got]):.0f} |"
            )
    if not whole:
        lines.append("| (no seed is complete) | | | | | | | | | | |")
    else:
        lines += [
            "",
            "Mean accuracy over the four widths seed by seed (seeds "
            f"{' / '.join(map(str, whole))}), then the mean over seeds with its range [min, max]:",
            "",
            "| method | " + " | ".join(f"er {er:g}" for er in ers) + f" | change er {ers[0]:g} -> {ers[-1]:g} |",
            "|---|" + "---|" * (len(ers) + 1),
        ]
        for label in shown:
            cells = []
            for values in [acc[(label, er)].mean(axis=1) for er in ers] + [
                acc[(label, ers[-1])].mean(axis=1) - acc[(label, ers[0])].mean(axis=1)
            ]:
                sign = "+" if len(cells) == len(ers) else ""
                cells.append(
                    " / ".join(f"{v:{sign}.3f}" for v in values)
                    + f"; **{values.mean():{sign}.3f}** [{values.min():{sign}.3f}, {values.max():{sign}.3f}]"
                )
            lines.append(f"| {label} | {' | '.join(cells)} |")
        lines += [
            "",
            f"Change from er = {ers[0]:g}, per seed (the same seed's run at er {ers[0]:g}), mean over seeds",
            "with the range over seeds in brackets; `mean` is the change of the mean over widths, `rel.` that",
            f"change relative to the mean at er {ers[0]:g}:",
            "",
            "| method | er | x0.25 | x0.5 | x0.75 | x1 | mean | rel. |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for er in ers[1:]:
            for label in shown:
                d = acc[(label, er)] - acc[(label, ers[0])]
                dm = d.mean(axis=1)
                rel = dm / acc[(label, ers[0])].mean(axis=1)
                cells = " | ".join(f"{d[:, j].mean():+.3f} {_range(d[:, j])}" for j in range(len(WIDTHS)))
                lines.append(f"| {label} | {er:g} | {cells} | {dm.mean():+.3f} {_range(dm)} | {rel.mean():+.0%} |")
        q = rounds / 4
        lines += [
            "",
            "Learning still going on late in the run: the mean accuracy over widths averaged over the evaluations",
            f"in rounds {q:g} < r <= {2 * q:g} and in rounds {3 * q:g} < r <= {rounds}, and the gain from the first",
            "window to the second, mean over seeds (seed by seed in brackets):",
            "",
            f"| method | er | rounds {q:g}-{2 * q:g} | rounds {3 * q:g}-{rounds} | gain |",
            "|---|---|---|---|---|",
        ]
        for er in ers:
            for label in shown:
                early, late = [], []
                for s in whole:
                    curves = runs[run_key(label, er, s)]["curves"]
                    at = np.asarray([r for r, _ in curves[WIDTHS[0]]])
                    m = np.mean([[a for _, a in curves[w]] for w in WIDTHS], axis=0)
                    early.append(m[(at > q) & (at <= 2 * q)].mean())
                    late.append(m[at > 3 * q].mean())
                gain = np.asarray(late) - np.asarray(early)
                lines.append(
                    f"| {label} | {er:g} | {np.mean(early):.3f} | {np.mean(late):.3f} | {gain.mean():+.3f} "
                    f"({', '.join(f'{g:+.3f}' for g in gain)}) |"
                )
    for s in partial:
        have = sorted(k for k in runs if k.endswith(f"/seed{s}") and k.split("/")[0] in shown)
        lines += [
            "",
            f"Seed {s} is left out, incomplete: {len(have)} of {len(shown) * len(ers)} runs "
            f"({', '.join(k.rsplit('/', 1)[0] for k in have) or 'none'}).",
        ]
    if decide:
        lines += decided(runs, shown, whole, ers)
    return "\n".join(lines) + "\n"


def figure(run: dict[str, Any]) -> float:
    """A run's figure for the decision rule: the mean over the widths of each width's last three evaluations."""
    return float(np.mean([tail_mean([a for _, a in run["curves"][w]]) for w in WIDTHS]))


def decided(runs: dict[str, Any], shown: list[str], whole: list[int], ers: tuple[float, ...]) -> list[str]:
    """Paper 004's orderings by the project's rule (``rayfl.report.decide``) over the complete seeds: FedResCuE's
    figure above each baseline's at every error rate, and its change from the first error rate to the last above
    theirs (it degrades least); with each method's client updates, training MACs and simulated hours."""

    def figures(label: str, er: float) -> list[float]:
        return [figure(runs[run_key(label, er, s)]) for s in whole]

    def mean_of(label: str, key: str) -> float:
        return float(np.mean([runs[run_key(label, er, s)].get(key, np.nan) for er in ers for s in whole]))

    if len(whole) < 3 or "FedResCuE" not in shown:
        return ["", f"Nothing decided: fewer than three complete seeds ({whole}), or no FedResCuE run."]
    best = max((lb for lb in shown if lb != "FedResCuE"), key=lambda lb: float(np.mean(figures(lb, ers[0]))))
    lines = [
        "",
        f"## Decided (seeds {' / '.join(map(str, whole))}; figure: mean over the widths of the last three "
        "evaluations; holds / reversed only when the gap of the 3-seed means exceeds twice the larger seed range)",
        "",
        f"Calibration: strongest baseline at er {ers[0]:g} {best} {np.mean(figures(best, ers[0])):.3f} against chance "
        f"0.10: **{100 * (np.mean(figures(best, ers[0])) - 0.10):+.1f} points**; runs took "
        f"{min(r['wall_s'] for k, r in runs.items() if k.split('/')[0] in shown) / 60:.1f}-"
        f"{max(r['wall_s'] for k, r in runs.items() if k.split('/')[0] in shown) / 60:.1f} min.",
        "",
        "| method | " + " | ".join(f"er {er:g}: per seed, mean" for er in ers) + " | client updates | train GMACs "
        "(the client's own sub-model, one pass a sample) | simulated s |",
        "|---|" + "---|" * (len(ers) + 3),
    ]
    for label in shown:
        cells = [
            f"{' / '.join(f'{v:.3f}' for v in figures(label, er))}, **{np.mean(figures(label, er)):.3f}**" for er in ers
        ]
        lines.append(
            f"| {label} | {' | '.join(cells)} | {mean_of(label, 'updates'):.0f} | "
            f"{mean_of(label, 'train_gmacs'):.2f} | {mean_of(label, 'sim_s'):.2f} |"
        )
    lines += ["", "| ordering | gap of means | 2 x larger range | verdict |", "|---|---:|---:|---|"]
    for other in (lb for lb in shown if lb != "FedResCuE"):
        for er in ers:
            word, gap, bar = verdict(figures("FedResCuE", er), figures(other, er))
            lines.append(f"| FedResCuE above {other} at er {er:g} | {gap:+.3f} | {bar:.3f} | **{word}** |")
        ours = [b - a for a, b in zip(figures("FedResCuE", ers[0]), figures("FedResCuE", ers[-1]), strict=True)]
        theirs = [b - a for a, b in zip(figures(other, ers[0]), figures(other, ers[-1]), strict=True)]
        word, gap, bar = verdict(ours, theirs)
        lines.append(
            f"| FedResCuE degrades less than {other} from er {ers[0]:g} to {ers[-1]:g} (changes "
            f"{np.mean(ours):+.3f} vs {np.mean(theirs):+.3f}) | {gap:+.3f} | {bar:.3f} | **{word}** |"
        )
    return lines


def sweep_table(
    runs: dict[str, Any],
    methods_: list[str],
    s_values: list[int],
    catalogue: dict[str, Any],
    seeds: list[int],
    ers: tuple[float, ...],
    rounds: int,
    command: str,
) -> str:
    """Per method, er and S: the mean accuracy over the widths (each the mean of the run's last ``RECENT``
    evaluations), mean over ``seeds`` where all are there, and the best S per method (highest mean over ers)."""
    lines = [
        f"# S sweep ({rounds} rounds, `{HERE.name}/cpu.yaml`, seeds {', '.join(map(str, seeds))}, "
        f"er {', '.join(f'{er:g}' for er in ers)})",
        "",
        "Produced by (the runs' figures are in the `--runs` file; `--table-only` rewrites this file from it)",
        "",
        f"    {command}",
        "",
        f"Mean accuracy over the x0.25 ... x1 sub-models, each the mean of the run's last {RECENT} evaluations",
        "(per-width figures in brackets: x0.25 / x0.5 / x0.75 / x1). S is each method's `num_ratios`: FedResCuE's",
        "and FedSlim's S ordered ratios end at the client's own (S - 1 below it); FjORD-004's S widths are all below",
        "the client's own, besides the client model's own step. Best S per method in bold.",
        "",
        "| method | er | " + " | ".join(f"S = {s}" for s in s_values) + " | best S |",
        "|---|---|" + "---|" * len(s_values) + "---|",
    ]
    for er in ers:
        for m in methods_:
            default = getattr(catalogue[m], "num_ratios", None)
            cells, means = [], []
            for s in s_values:
                label = m if s == default else f"{m}-S{s}"
                got = [runs[k] for seed in seeds if (k := run_key(label, er, seed)) in runs]
                if len(got) < len(seeds) or not got:
                    cells.append("(not run)")
                    means.append(-1.0)
                    continue
                a = np.mean([recent(g) for g in got], axis=0)
                means.append(float(a.mean()))
                cells.append(f"{a.mean():.3f} ({' / '.join(f'{x:.3f}' for x in a)})")
            best = int(np.argmax(means))
            cells[best] = f"**{cells[best]}**"
            lines.append(f"| {m} | {er:g} | {' | '.join(cells)} | {s_values[best]} |")
    return "\n".join(lines) + "\n"


def _mean_curve(got: list[dict[str, Any]], width: str) -> tuple[list[int], np.ndarray]:
    rounds = [r for r, _ in got[0]["curves"][width]]
    return rounds, np.mean([[a for _, a in g["curves"][width]] for g in got], axis=0)


def plot_curves(
    runs: dict[str, Any], labels: list[str], seeds: list[int], path: Path, ers: tuple[float, ...] = ERROR_RATES
) -> None:
    """One panel per error rate and width, one line per method: accuracy against rounds, mean over seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels, seeds = complete_seeds(runs, labels, seeds, ers)
    fig = Figure(figsize=(3.2 * len(WIDTHS), 2.8 * len(ers)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(ers), len(WIDTHS), squeeze=False)
    for i, er in enumerate(ers):
        for j, width in enumerate(WIDTHS):
            ax = axes[i][j]
            for label in labels:
                got = [runs[k] for s in seeds if (k := run_key(label, er, s)) in runs]
                if got:
                    rounds, acc = _mean_curve(got, width)
                    ax.plot(rounds, acc, label=label)
            ax.set_title(f"er {er:g}, {width}", fontsize=9)
            ax.set_xlabel("Round")
            ax.set_ylabel("Test accuracy")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Accuracy of each x p sub-model against rounds (mean over seeds {', '.join(map(str, seeds))})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_bytes(
    runs: dict[str, Any], labels: list[str], seeds: list[int], path: Path, ers: tuple[float, ...] = ERROR_RATES
) -> None:
    """One panel per error rate: mean accuracy over the widths against MB moved (down + up), mean over seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels, seeds = complete_seeds(runs, labels, seeds, ers)
    fig = Figure(figsize=(4.2 * len(ers), 3.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(ers), squeeze=False)[0]
    for ax, er in zip(axes, ers, strict=True):
        for label in labels:
            got = [runs[k] for s in seeds if (k := run_key(label, er, s)) in runs]
            if not got:
                continue
            acc = np.mean([_mean_curve(got, w)[1] for w in WIDTHS], axis=0)
            moved = np.mean([g["mb_moved"] for g in got], axis=0)
            ax.plot(moved, acc, label=label)
        ax.set_title(f"er {er:g}", fontsize=9)
        ax.set_xlabel("MB moved (down + up)")
        ax.set_ylabel("Mean accuracy over x0.25 ... x1")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Mean accuracy against MB moved (mean over seeds {', '.join(map(str, seeds))})")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=100)


def run_all(
    base: Any,
    catalogue: dict[str, Any],
    labels: list[str],
    seeds: list[int],
    ers: tuple[float, ...],
    runs: dict[str, Any],
    path: Path,
) -> None:
    """Every run not yet in ``runs`` at ``base.rounds``, seed by seed; each one's figures saved as it finishes."""
    for seed in seeds:
        for er in ers:
            links = dataclasses.replace(base.system.links, error_rate=ResourceConfig(source="constant", low=er))
            for label in labels:
                key = run_key(label, er, seed)
                if key in runs and runs[key].get("rounds") == base.rounds:
                    continue
                method, algorithm, steps = resolve(label, catalogue)
                cfg = dataclasses.replace(
                    base,
                    name=f"{method.lower()}{'-x2' if steps > 1 else ''}-er{er:g}-seed{seed}",
                    seed=seed,
                    algorithm=algorithm,
                    system=dataclasses.replace(base.system, links=links),
                    train=dataclasses.replace(base.train, steps_per_batch=steps),
                )
                began = time.perf_counter()
                result = run_experiment(cfg)
                runs[key] = {"rounds": base.rounds, **summarise(result, time.perf_counter() - began)}
                path.write_text(json.dumps(runs, indent=1) + "\n")
                print(f"{key}: acc x.25/.5/.75/1 = {runs[key]['final']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="cpu.yaml", help="the setting: a YAML of experiments/fedrescue/ or a path")
    parser.add_argument("--rounds", type=int, default=0, help="override the YAML's rounds")
    parser.add_argument(
        "--decide", action="store_true", help="add FedResCuE's orderings decided over the complete seeds (3 or more)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[], help="default 0; --table-only: all in --runs")
    parser.add_argument("--table-only", action="store_true", help="run nothing; tabulate and plot from --runs")
    parser.add_argument("--methods", nargs="+", default=[], help="labels to run and show (default: all six)")
    parser.add_argument("--error-rates", type=float, nargs="+", default=list(ERROR_RATES), help="the first is the base")
    parser.add_argument("--runs", default=str(HERE / "runs.json"), help="every finished run's figures (JSON)")
    parser.add_argument("--out", default=str(HERE / "results.md"))
    parser.add_argument("--curves", default="", help="write each width's accuracy against rounds to this PNG")
    parser.add_argument("--bytes-plot", default="", help="write mean accuracy against MB moved to this PNG")
    parser.add_argument("--output-dir", default="", help="where the runs go (default: the YAML's output_dir)")
    parser.add_argument("--command", default="", help="the command line to state in the table")
    parser.add_argument("--eval-every", type=int, default=0, help="override the YAML's eval_every")
    parser.add_argument(
        "--s-sweep",
        type=int,
        nargs="+",
        default=[],
        help="run each of --methods at each of these S (num_ratios) and write the S-sweep table to --out",
    )
    parser.add_argument(
        "--paper-optimizer", action="store_true", help="paper 004's SGD for every method: lr 0.1, Nesterov, wd 1e-4"
    )
    args = parser.parse_args()
    config = HERE / args.config if (HERE / args.config).is_file() else Path(args.config)
    base = dataclasses.replace(load_config(config), eval_widths=CAPACITIES)
    if args.rounds:
        base = dataclasses.replace(base, rounds=args.rounds)
    if args.eval_every:
        base = dataclasses.replace(base, eval_every=args.eval_every)
    if args.paper_optimizer:
        base = dataclasses.replace(base, train=dataclasses.replace(base.train, **PAPER_OPTIMIZER))
    if args.output_dir:
        base = dataclasses.replace(base, output_dir=args.output_dir)
    assert isinstance(base.algorithm, FedResCuEConfig)
    catalogue = methods(base.algorithm)
    labels = args.methods or list(catalogue)
    if args.s_sweep:
        labels = [
            m if s == getattr(catalogue.get(m), "num_ratios", None) else f"{m}-S{s}"
            for m in labels
            for s in args.s_sweep
        ]
    unknown = [lb for lb in labels if resolve(lb, catalogue)[1] is None]
    if unknown:
        parser.error(
            f"--methods: {unknown} are not among {list(catalogue)} (optionally with '-S<n>' for a method that has S, "
            f"then '{EQUAL}')"
        )
    path = Path(args.runs)
    runs: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    ers = tuple(args.error_rates)
    if args.table_only:
        seeds = args.seeds or sorted({int(k.rsplit("seed", 1)[1]) for k in runs})
    else:
        seeds = args.seeds or [0]
        run_all(base, catalogue, labels, seeds, ers, runs, path)
    done = {k: v for k, v in runs.items() if v.get("rounds") == base.rounds}
    command = args.command or shlex.join(["python", "experiments/fedrescue/run_table.py", *sys.argv[1:]])
    if args.s_sweep:
        text = sweep_table(done, args.methods, args.s_sweep, catalogue, seeds, ers, base.rounds, command)
    else:
        text = table(done, labels, seeds, base.rounds, command, ers, config.name, args.decide)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    if args.curves:
        plot_curves(done, labels, seeds, Path(args.curves), ers)
        print(f"wrote {args.curves}")
    if args.bytes_plot:
        plot_bytes(done, labels, seeds, Path(args.bytes_plot), ers)
        print(f"wrote {args.bytes_plot}")


if __name__ == "__main__":
    main()
