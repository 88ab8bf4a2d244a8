"""FedorAS against rand-init, tier-aware FedAvg and FjORD per tier (paper 003 Tab. 4-5, Fig. 3), CPU-sized.

Runs, on one setting (synthetic images, LDA alpha = 1.0, 20 clients in 4 tiers by compute speed):

1. ``cpu.yaml``: FedorAS's three phases (supernet training, NSGA-II search, per-tier fine-tuning from the supernet);
2. rand-init: ``tier_aware.yaml`` with ``architectures: given`` and the paths FedorAS chose (same architectures, random
   initialisation, trained for as many rounds as FedorAS's supernet training and fine-tuning together);
3. rand-init for the fine-tuning phase's rounds only (the same architectures and training budget as FedorAS's third
   phase: what the supernet's weights are worth at equal fine-tuning);
4. ``tier_aware.yaml``: tier-aware FedAvg (a random in-bracket path per tier, random initialisation);
5. ``fjord.yaml``: FjORD (ordered dropout on a ResNet-18, tier t's clients up to width p_t);
6. ``fjord_ops.yaml``: the same FjORD on a ResNet of the supernet's own ops (the largest path, official MBConv,
   width-elastic): issue 25's control separating "the family" from "the method";
7. paper 003's App. E random search: further draws of tier-aware FedAvg (``draw`` 1, 2, ...: other random in-bracket
   paths, random initialisation, the baseline rounds), drawn until their simulated time together with
   tier-aware FedAvg's (draw 0) exceeds FedorAS's (the paper: "until the total training cost exceeded the cost of
   running FedorAS"), at most ``--max-draws``; per tier the draw with the best mean test accuracy of the last 5
   rounds (the paper keeps "the best model for each tier"; it is an optimistic pick: the same test rounds score it).

and writes a markdown table per tier (test accuracy averaged over the last 5 rounds and at the last round, forward
MFLOPs and parameters of the tier's model) with the simulated time of every phase, plus the accuracy each tier's
chosen path had with the supernet's weights before fine-tuning. ``--set key=value`` overrides apply to cpu.yaml;
``seed`` and ``data.*`` ones to every run, ``model.*`` ones also to the baselines in the supernet's space (e.g. all
nine ops and six local epochs:
``--set "model.ops=[conv1,ds3_e0.5,ds3_e1,ds3_e2,mb1_e2,mb3_e0.5,mb3_e1,mb3_e2,identity]" --set phases.0.epochs=6``).

    python experiments/fedoras/run_table.py [--set KEY=VALUE ...] [--out FILE] [--output-dir runs/fedoras]
        [--records DIR] [--overwrite]

``--records DIR``: take every run whose directory ``DIR/<its name>`` exists (``fedoras_cpu``, ``fedoras_rand_init``,
``fedoras_rand_init_short``, ``fedoras_tier_aware``, ``fedoras_fjord``, ``fedoras_fjord_ops``: a committed
``records_*`` folder) from there instead of running it, after checking that its ``config.yaml`` is the config this
command would run; the others run. With every run recorded the table regenerates in seconds.

The table goes to ``--out`` (default ``results_run.md`` beside this file); an existing file is refused unless
``--overwrite`` is given (the committed ``results*.md`` are records of earlier code).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rayfl.engine.build import build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.fedoras.config import FedorASFinetuneConfig

HERE = Path(__file__).parent
RECENT = 5  # the table's accuracy: the mean over the last RECENT evaluated rounds


@dataclasses.dataclass(frozen=True)
class Done:
    """A finished run, run now or read from its record directory."""

    cfg: ExperimentConfig
    run_dir: Path
    summary: dict[str, Any]
    rounds: pd.DataFrame

    @property
    def evals(self) -> pd.DataFrame:
        return pd.read_csv(self.run_dir / "evals.csv")


def _comparable(cfg: ExperimentConfig) -> ExperimentConfig:
    return dataclasses.replace(cfg, output_dir="")


def run(cfg: ExperimentConfig, label: str, records: Path | None) -> Done:
    """``cfg`` run now, or read from ``records/<cfg.name>`` when that holds the same config."""
    recorded = None if records is None else records / cfg.name
    if recorded is not None and recorded.is_dir():
        kept = load_config(recorded / "config.yaml")
        if _comparable(kept) != _comparable(cfg):
            raise SystemExit(f"{recorded / 'config.yaml'}: not the config this command runs for {label}")
        run_dir = recorded
        print(f"{label}: from {run_dir}", flush=True)
    else:
        began = time.perf_counter()
        result = run_experiment(cfg)
        assert result.run_dir is not None
        run_dir = result.run_dir
        print(f"{label}: {run_dir} ({time.perf_counter() - began:.0f} s wall)", flush=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    return Done(cfg, run_dir, summary, pd.read_csv(run_dir / "rounds.csv"))


def finetune_only(base: ExperimentConfig, name: str, rounds: int, **algorithm: Any) -> ExperimentConfig:
    """``base`` (tier_aware.yaml) as a fine-tuning-only run of ``rounds`` rounds with other algorithm settings."""
    phase = base.phases[0]
    assert isinstance(phase.algorithm, FedorASFinetuneConfig)
    tuned = dataclasses.replace(
        phase, name=name, rounds=rounds, algorithm=dataclasses.replace(phase.algorithm, **algorithm)
    )
    return dataclasses.replace(base, name=f"fedoras_{name}", rounds=rounds, phases=(tuned,))


def random_draw(base: ExperimentConfig, draw: int) -> ExperimentConfig:
    """``base`` (tier_aware.yaml) with the ``draw``-th set of random in-bracket paths (App. E's random search)."""
    phase = base.phases[0]
    assert isinstance(phase.algorithm, FedorASFinetuneConfig)
    drawn = dataclasses.replace(phase, algorithm=dataclasses.replace(phase.algorithm, draw=draw))
    return dataclasses.replace(base, name=f"fedoras_random_{draw}", phases=(drawn,))


def recent_tier_accs(done: Done, last: int) -> np.ndarray:
    """Each tier model's test accuracy averaged over the run's ``last`` evaluated rounds (``model_accs`` of
    ``rounds.csv``): one evaluation swings by a few points from round to round at this scale."""
    rows = [str(v).split() for v in done.rounds.model_accs if isinstance(v, str) and v]
    means: np.ndarray = np.asarray(rows[-last:], dtype=np.float64).mean(axis=0)
    return means


def fjord_tiers(cfg: ExperimentConfig, evals: pd.DataFrame) -> list[dict[str, float]]:
    """Per FjORD width (one per tier): the x p sub-model's last test accuracy (``evals.csv``), forward FLOPs and
    parameters."""
    from rayfl.models.elastic.spec import SubModelSpec

    oracle = build_clock(cfg, build_setup(cfg)).oracle
    cost, family = oracle.elastic, oracle.family
    assert cost is not None and family is not None
    out = []
    for p in cfg.eval_widths:
        units = family.space.units(SubModelSpec.uniform(family.space, float(p)).ratios)
        c = cost.evaluate(np.array([units]))
        accs = evals[evals.name == f"x{p:g}"].sort_values("round_idx").test_acc.to_numpy()
        out.append(
            {
                "width": float(p),
                "test_acc": float(accs[-1]),
                "recent_acc": float(accs[-RECENT:].mean()),
                "flops": float(c.flops[0]),
                "params": float(c.params[0]),
            }
        )
    return out


def phase_times(summary: dict[str, Any]) -> str:
    phases = summary.get("phases") or [{"name": "all", "sim_time_s": summary["sim_time_s"]}]
    return ", ".join(f"{p['name']} {p['sim_time_s']:.0f} s" for p in phases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="KEY=VALUE for cpu.yaml")
    parser.add_argument("--out", default=str(HERE / "results_run.md"))
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--output-dir", default="runs/fedoras")
    parser.add_argument("--records", help="take the runs recorded in this folder (one subfolder per run name)")
    parser.add_argument("--smoke", action="store_true", help="two rounds per phase, to check the pipeline")
    parser.add_argument("--max-draws", type=int, default=10, help="App. E random search: at most this many draws")
    parser.add_argument(
        "--baseline-rounds",
        type=int,
        default=0,
        help="rounds of rand-init, tier-aware FedAvg and FjORD (default: "
        "their YAML's); set it to cpu.yaml's supernet + fine-tuning rounds when those are overridden",
    )
    args = parser.parse_args()
    if Path(args.out).exists() and not args.overwrite:
        parser.error(f"--out {args.out} exists (a table of earlier runs?): name another file or add --overwrite")
    records = Path(args.records) if args.records else None
    out_dir = [f"output_dir={args.output_dir}"]
    common = [o for o in args.overrides if o.startswith(("seed=", "data."))]  # every run's setting
    shared = [*common, *(o for o in args.overrides if o.startswith("model."))]  # runs in the supernet's space
    smoke = ["rounds=6", "phases.0.rounds=2", "phases.1.rounds=2", "phases.2.rounds=2"] if args.smoke else []
    short = ["rounds=2", "phases.0.rounds=2"] if args.smoke else []
    if args.baseline_rounds:
        short = [f"rounds={args.baseline_rounds}", f"phases.0.rounds={args.baseline_rounds}"]

    fedoras_cfg = load_config(HERE / "cpu.yaml", [*args.overrides, *smoke, *out_dir])
    search_cfg = fedoras_cfg.phases[1].algorithm
    if getattr(search_cfg, "eval_batch_size", None) != fedoras_cfg.train.eval_batch_size:
        parser.error("cpu.yaml: the search's eval_batch_size must equal train.eval_batch_size (one per column)")
    fedoras = run(fedoras_cfg, "FedorAS", records)
    phases = fedoras.summary["phases"]
    searched, tuned = phases[1]["result"]["tiers"], phases[2]["result"]["tiers"]
    paths = tuple(tuple(t["path"]) for t in tuned)

    base = load_config(HERE / "tier_aware.yaml", [*shared, *short, *out_dir])
    budget = base.rounds
    finetune_rounds = fedoras_cfg.phases[2].rounds
    runs = {
        f"rand-init ({budget} rounds)": finetune_only(base, "rand_init", budget, architectures="given", paths=paths),
        f"rand-init ({finetune_rounds} rounds)": finetune_only(
            base, "rand_init_short", finetune_rounds, architectures="given", paths=paths
        ),
        "tier-aware FedAvg": base,
    }
    results = {label: run(cfg, label, records) for label, cfg in runs.items()}
    draws = [results["tier-aware FedAvg"]]  # App. E: draw 0 is tier-aware FedAvg; draw until FedorAS's cost
    while sum(d.summary["sim_time_s"] for d in draws) <= fedoras.summary["sim_time_s"] and len(draws) < args.max_draws:
        draws.append(run(random_draw(base, len(draws)), f"random search, draw {len(draws)}", records))
    fjord_rounds = [f"rounds={args.baseline_rounds}"] if args.baseline_rounds else []
    fjord_rounds = ["rounds=2"] if args.smoke else fjord_rounds
    widths = {}
    for label, yaml in (("FjORD", "fjord.yaml"), ("FjORD on the supernet's ops", "fjord_ops.yaml")):
        done = run(load_config(HERE / yaml, [*common, *fjord_rounds, *out_dir]), label, records)
        widths[label] = (done, fjord_tiers(done.cfg, done.evals))

    recent = {"FedorAS": recent_tier_accs(fedoras, RECENT)}
    recent.update({label: recent_tier_accs(done, RECENT) for label, done in results.items()})
    draw_accs = np.array([recent_tier_accs(d, RECENT) for d in draws])  # (draws, tiers)
    search_label = f"App. E random search (best of {len(draws)})"
    recent[search_label] = draw_accs.max(axis=0)
    best_draw = draw_accs.argmax(axis=0)
    lines = [
        f"| tier | method | test acc (mean of last {RECENT} rounds) | final | MFLOPs | params | path |",
        "|---|---|---|---|---|---|---|",
    ]
    for tier, row in enumerate(tuned):
        entries = [("FedorAS", row), ("supernet weights, no fine-tuning", searched[tier])]
        for label, done in results.items():
            entries.append((label, done.summary["phases"][0]["result"]["tiers"][tier]))
        best = draws[int(best_draw[tier])].summary["phases"][0]["result"]["tiers"][tier]
        entries.append((search_label, {**best, "path": [f"(draw {best_draw[tier]})", *best["path"]]}))
        for label, t in entries:
            mean = f"{100 * recent[label][tier]:.1f} %" if label in recent else "-"
            acc, mflops, path = 100 * t["test_acc"], t["flops"] / 1e6, " ".join(t["path"])
            lines.append(f"| {tier} | {label} | {mean} | {acc:.1f} % | {mflops:.2f} | {t['params']:,.0f} | {path} |")
        for label, (done, rows) in widths.items():
            f = rows[tier]
            model = "ResNet-18" if label == "FjORD" else " ".join(done.cfg.model.path)  # type: ignore[union-attr]
            lines.append(
                f"| {tier} | {label} (x{f['width']:g}) | {100 * f['recent_acc']:.1f} % | {100 * f['test_acc']:.1f} % "
                f"| {f['flops'] / 1e6:.2f} | {f['params']:,.0f} | {model} at x{f['width']:g} |"
            )
    lines += ["", "Simulated time per phase:", ""]
    lines.append(f"- FedorAS: {phase_times(fedoras.summary)}")
    for label, done in results.items():
        lines.append(f"- {label}: {phase_times(done.summary)}")
    for label, (done, _) in widths.items():
        lines.append(f"- {label}: {phase_times(done.summary)}")
    spent = sum(d.summary["sim_time_s"] for d in draws)
    lines.append(
        f"- App. E random search: {len(draws)} draws of tier-aware FedAvg ({', '.join(d.cfg.name for d in draws)}), "
        f"{spent:.0f} s together against FedorAS's {fedoras.summary['sim_time_s']:.0f} s; every draw's mean of the "
        f"last {RECENT} rounds per tier: "
        + "; ".join(" / ".join(f"{100 * a:.1f}" for a in row) for row in draw_accs)
        + " %"
    )
    lines.append(f"\nMost-frequent-label baseline: {100 * fedoras.summary['baseline_acc']:.1f} %.")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
