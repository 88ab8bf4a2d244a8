"""Issue 40's tables from the committed run records: the calibration of the CPU settings and the decided comparison.

    python experiments/issue40/table.py > experiments/issue40/table.md

Reads ``experiments/issue40/setting{N}/seedS/METHOD/{rounds.csv,clients.csv,evals.csv,config.yaml}`` and
``setting{N}/timings.tsv`` as ``run_setting.sh`` wrote them (rayfl builds each model once to read its full widths).

Accuracy of a run is the mean of its last three evaluations (issue 17's reading). Chance is the most frequent test
label's share: 10 % on MNIST 5k's test set (100 digits of each class), on other data read from the run's test set
(setting 6: the most frequent next character of the Shakespeare windows, the space).

* **Calibration** (item 4): per setting, FedAvg on the largest model (budgets ignored) and on the smallest, 3-seed
  mean against chance, the targets (+25 and +10 points) and the wall minutes per run (the slowest method's mean).
* **Decided** (item 6): per setting and method, the three seeds, their mean and range; client updates (client-rounds
  that trained and reached the server), failed client-rounds with the reason as ``clients.csv`` records it, training
  MACs and simulated hours (3-seed means). Width-sliced methods: the share of their client-rounds that trained the
  full width, and the 3-seed mean scores of the global model's first-k sub-models at widths 0.5 and 0.25
  (``evals.csv``, ``x{p}``), the widths most of their clients train where the full width rarely fits.
* **Orderings**: "A >= B holds" when mean(A) - mean(B) > 2 x the larger of the two seed ranges, "reversed" when
  mean(B) - mean(A) exceeds it, else "undecided".
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import Counter
from pathlib import Path

from rayfl.report import decide

HERE = Path(__file__).resolve().parent
SEEDS = (0, 1, 2)
METHODS = [
    ("core", "core (model search + distillation)"),
    ("core-no-distill", "core without distillation"),
    ("heterofl", "HeteroFL"),
    ("heterofl-distill", "HeteroFL + distillation"),
    ("fedrolex", "FedRolex"),
    ("fjord", "FjORD"),
    ("smallest", "FedAvg smallest"),
    ("largest", "FedAvg largest (budgets ignored)"),
]
ABLATIONS = [
    ("core-distill-lr1e-4", "control: core, distillation's Adam at lr 1e-4 (the paper's / 10)"),
    ("core-distill-data", "control: core, distilling on training samples instead of noise"),
    ("core-distill-follow", "control: core, the distillation's lr following the clients' schedule"),
    ("heterofl-static-bn", "HeteroFL, static BN (its own evaluation protocol)"),
    ("heterofl-clip", "HeteroFL, clipping at norm 1 (its code's)"),
]
WIDTH_SLICED = {"heterofl", "heterofl-distill", "fedrolex", "fjord", "heterofl-clip"}
COMPARISONS = [
    ("core", "heterofl"),
    ("core", "fedrolex"),
    ("core", "fjord"),
    ("core", "smallest"),
    ("core", "largest"),
    ("core-no-distill", "heterofl"),
    ("core-no-distill", "fedrolex"),
    ("core-no-distill", "fjord"),
    ("core-no-distill", "smallest"),
    ("core", "core-no-distill"),
    ("heterofl-distill", "heterofl"),
]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


class Run:
    """One run's records."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rounds = read_csv(folder / "rounds.csv")
        self.clients = read_csv(folder / "clients.csv")
        evals = folder / "evals.csv"
        self.evals = read_csv(evals) if evals.exists() else []

    def accuracies(self, name: str = "") -> list[float]:
        if not name:
            return [a for a in (number(r["test_acc"]) for r in self.rounds) if not math.isnan(a)]
        return [number(r["test_acc"]) for r in self.evals if r["name"] == name]

    def last3(self, name: str = "") -> float:
        acc = self.accuracies(name)
        return 100 * sum(acc[-3:]) / len(acc[-3:]) if acc else math.nan

    def failures(self) -> Counter[str]:
        return Counter(r["failure"] for r in self.clients if r["failure"])

    def updates(self) -> int:
        return sum(1 for r in self.clients if not r["failure"])

    def macs(self) -> float:
        return sum(number(r["train_macs"]) for r in self.rounds if not math.isnan(number(r["train_macs"])))

    def sim_hours(self) -> float:
        return number(self.rounds[-1]["sim_time_s"]) / 3600

    def trained_widths(self) -> list[float]:
        """Width ratios the clients that reached the server trained at: a client's ``units`` over the model's full
        units in its widest dimension, snapped to the nearest evaluated width (``x{p}`` in ``evals.csv``, and 1)."""
        full = full_units(self.folder / "config.yaml")
        widest = max(range(len(full)), key=lambda d: full[d])
        widths = sorted({float(r["name"][1:]) for r in self.evals if r["name"].startswith("x")} | {1.0})
        out = []
        for r in self.clients:
            if r["failure"]:
                continue
            units = r["units"].split()
            ratio = 1.0 if not units else int(units[widest]) / full[widest]
            out.append(min(widths, key=lambda w: abs(w - ratio)))
        return out


_FULL: dict[str, tuple[int, ...]] = {}


def full_units(config: Path) -> tuple[int, ...]:
    """The full model's units per dimension, from the run's own model section and the input its data gives."""
    import yaml

    key = repr(yaml.safe_load(config.read_text())["model"])
    if key not in _FULL:
        from rayfl.experiment.loader import load_config
        from rayfl.models.families import build_family
        from rayfl.models.inputs import InputSpec

        # the run's model section (system={}: its resource files are not needed to build the model)
        cfg = load_config(config, ["system={}", "output_dir=/tmp"])
        spec = (
            InputSpec("tokens", 81, (cfg.data.seq_len,))
            if cfg.data.name == "shakespeare"
            else InputSpec("image", 10, (1, 32, 32))
        )
        _FULL[key] = tuple(build_family(cfg.model, spec).full_units)
    return _FULL[key]


def chance(run: Run | None) -> float:
    """The run's trivial baseline in %: the most frequent test label's share (``summary.json``'s ``baseline_acc``;
    MNIST 5k: 10 %). A setting whose test set depends on the seed (Shakespeare's sampled roles) has one per seed."""
    if run is None:
        return math.nan
    return 100.0 * float(json.loads((run.folder / "summary.json").read_text())["baseline_acc"])


def load(setting: int, method: str) -> list[Run | None]:
    runs: list[Run | None] = []
    for seed in SEEDS:
        folder = HERE / f"setting{setting}" / f"seed{seed}" / method
        runs.append(Run(folder) if (folder / "rounds.csv").exists() else None)
    return runs


def stats(values: list[float]) -> tuple[float, float]:
    got = [v for v in values if not math.isnan(v)]
    if len(got) < len(SEEDS):
        return math.nan, math.nan
    return sum(got) / len(got), max(got) - min(got)


def fmt(value: float, digits: int = 1) -> str:
    return "—" if math.isnan(value) else f"{value:.{digits}f}"


def verdict(a: list[float], b: list[float]) -> tuple[str, float, float]:
    """The project's rule (``rayfl.report.decide.verdict``) once both methods have every seed, else "not run"."""
    if math.isnan(stats(a)[0]) or math.isnan(stats(b)[0]):
        return "not run", math.nan, math.nan
    return decide.verdict(a, b)


def wall_minutes(setting: int) -> dict[str, float]:
    path = HERE / f"setting{setting}" / "timings.tsv"
    per: dict[str, list[float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            _seed, method, seconds, rc = line.split("\t")
            if rc == "0":
                per.setdefault(method, []).append(int(seconds) / 60)
    return {m: sum(v) / len(v) for m, v in per.items()}


def settings_run() -> list[int]:
    return sorted(int(p.name[len("setting") :]) for p in HERE.glob("setting*") if p.is_dir())


def chance_cell(chances: list[float], mean: float) -> str:
    got = [c for c in chances if not math.isnan(c)]
    if got and max(got) - min(got) < 0.05:
        return f"{fmt(got[0])} %"
    return f"{' / '.join(fmt(c) for c in chances)} % ({fmt(mean)})"


def calibration(settings: list[int]) -> list[str]:
    out = [
        "## Calibration (item 4): FedAvg largest / smallest against chance, 3 seeds",
        "",
        "| setting | chance | largest: seeds (mean) | largest - chance | smallest: seeds (mean) | smallest - chance "
        "| targets met | wall min per run (mean, slowest method) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in settings:
        large, small = load(n, "largest"), load(n, "smallest")
        la = [r.last3() if r else math.nan for r in large]
        sa = [r.last3() if r else math.nan for r in small]
        lm, sm = stats(la)[0], stats(sa)[0]
        chances = [chance(r) for r in large]
        ch = stats(chances)[0]
        # above chance seed by seed (each seed's own test set), then the mean over seeds
        lg = stats([v - c for v, c in zip(la, chances, strict=True)])[0]
        sg = stats([v - chance(r) for v, r in zip(sa, small, strict=True)])[0]
        met = "—" if math.isnan(lg) or math.isnan(sg) else ("yes" if lg >= 25 and sg >= 10 else "no")
        # the comparison's methods only: the controls and ablations ran later, some beside other work
        walls = {m: v for m, v in wall_minutes(n).items() if m in dict(METHODS)}
        slow = max(walls.items(), key=lambda kv: kv[1]) if walls else ("—", math.nan)
        out.append(
            f"| {n} | {chance_cell(chances, ch)} | {' / '.join(fmt(v) for v in la)} ({fmt(lm)}) | {fmt(lg, 1)} "
            f"| {' / '.join(fmt(v) for v in sa)} ({fmt(sm)}) | {fmt(sg, 1)} | {met} "
            f"| {fmt(slow[1])} ({slow[0]}) |"
        )
    return out


def setting_table(n: int) -> list[str]:
    out = [
        f"## Setting {n}",
        "",
        "| method | seed 0 | seed 1 | seed 2 | mean | range | client-rounds at full width; sub-width scores "
        "| client updates | failed "
        "(reason) | MACs (T) | sim h | wall min |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    walls = wall_minutes(n)
    for method, label in METHODS + ABLATIONS:
        runs = load(n, method)
        if not any(runs):
            continue
        acc = [r.last3() if r else math.nan for r in runs]
        mean, spread = stats(acc)
        width_cell = "—"
        done = [r for r in runs if r is not None]
        if method in WIDTH_SLICED and done:
            trained = [w for r in done for w in r.trained_widths()]
            full_share = 100 * sum(1 for w in trained if w == 1.0) / max(1, len(trained))
            subs = []
            for p in (0.5, 0.25):
                sub = [r.last3(f"x{p:g}") if r else math.nan for r in runs]
                subs.append(f"x{p:g} {fmt(stats(sub)[0])}")
            width_cell = f"{full_share:.0f} %; {', '.join(subs)}"
        fails: Counter[str] = Counter()
        for r in done:
            fails.update(r.failures())
        nfail = sum(fails.values()) / max(1, len(done))
        reason = ", ".join(f"{k} {v / len(done):.0f}" for k, v in fails.most_common()) if fails else ""
        updates = sum(r.updates() for r in done) / max(1, len(done))
        macs = sum(r.macs() for r in done) / max(1, len(done)) / 1e12
        hours = sum(r.sim_hours() for r in done) / max(1, len(done))
        out.append(
            f"| {label} | {' | '.join(fmt(v) for v in acc)} | {fmt(mean)} | {fmt(spread)} | {width_cell} "
            f"| {updates:.0f} | {nfail:.0f}{f' ({reason})' if reason else ''} | {macs:.2f} | {hours:.2f} "
            f"| {fmt(walls.get(method, math.nan))} |"
        )
    out += ["", "| ordering | gap of means (points) | 2 x larger range | verdict |", "|---|---|---|---|"]
    controls = [
        ("core-distill-lr1e-4", "core"),
        ("core-no-distill", "core-distill-lr1e-4"),
        ("core-distill-data", "core"),
        ("core-no-distill", "core-distill-data"),
        ("core-distill-follow", "core"),
        ("core-no-distill", "core-distill-follow"),
        ("heterofl", "heterofl-static-bn"),
        ("heterofl", "heterofl-clip"),
    ]
    for a, b in COMPARISONS + controls:
        runs_a, runs_b = load(n, a), load(n, b)
        if not any(runs_a) or not any(runs_b):
            continue
        va = [r.last3() if r else math.nan for r in runs_a]
        vb = [r.last3() if r else math.nan for r in runs_b]
        word, gap, bar = verdict(va, vb)
        out.append(f"| {a} >= {b} | {fmt(gap)} | {fmt(bar)} | {word} |")
    # the width-sliced baselines scored at width 0.5 instead of their full global model (item 5)
    for a, b in (("core-no-distill", "heterofl"), ("core-no-distill", "fedrolex"), ("core", "heterofl")):
        runs_a, runs_b = load(n, a), load(n, b)
        if not any(runs_a) or not any(runs_b):
            continue
        va = [r.last3() if r else math.nan for r in runs_a]
        vb = [r.last3("x0.5") if r else math.nan for r in runs_b]
        word, gap, bar = verdict(va, vb)
        out.append(f"| {a} >= {b} scored at width 0.5 | {fmt(gap)} | {fmt(bar)} | {word} |")
    return out


def main(argv: list[str]) -> None:
    settings = [int(a) for a in argv] or settings_run()
    lines = ["# Issue 40: paper 000 at CPU scale, calibrated and decided", "",
             "Generated by `python experiments/issue40/table.py` from the records under `experiments/issue40/`; "
             "accuracy in % as the mean of the last three evaluations.", ""]  # fmt: skip
    lines += [*calibration(settings), ""]
    for n in settings:
        lines += [*setting_table(n), ""]
    print("\n".join(lines).rstrip())


if __name__ == "__main__":
    main(sys.argv[1:])
