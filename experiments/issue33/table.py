"""Issue 33's accuracy tables at CPU scale: one per setting, accuracy per seed beside the search statistics.

    PYTHONPATH=$PWD python experiments/issue33/table.py [experiments/issue33/setting{N} ...] > \
        experiments/issue33/table.md

Reads the runs ``run_setting.sh`` wrote (``SETTING_DIR/seedS/setting{N}-NAME/{config.yaml,rounds.csv,clients.csv}``;
every ``experiments/issue33/setting*`` when none is named) and prints, per setting:

* the search-only statistics of ``benchmarks/results/issue33/records.json`` (``rayfl search``, 30 rounds, no
  training) for the core method as shipped and before issue 33: mean parameters assigned relative to HeteroFL's,
  the share of clients given more than HeteroFL's model, parameters relative to the largest structure that fits,
  memory utilisation and distinct structures;
* per method and seed: the mean test accuracy of the last three evaluations (issue 17's reading), the final one,
  the simulated hours, the mean memory and bandwidth utilisation of the clients that ran (the model's own need,
  overhead excluded), the clients that failed, the distinct structures assigned, and the mean over client-rounds of
  the parameters a client trained relative to the parameters HeteroFL's run of the same seed gave the same client in
  the same round (both ran);
* the most frequent test label's accuracy (chance) and core (no distillation) minus HeteroFL, per seed.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
SEARCH_RECORDS = ROOT / "benchmarks" / "results" / "issue33" / "records.json"
ORDER = [
    "heterofl",
    "model_search-no-distill",
    "model_search-no-distill-before",
    "model_search",
    "fedrolex",
    "fjord",
    "smallest",
    "largest",
]
# the search-only variants that match the runs: the shipped set-up and the one before issue 33 as it was run
SEARCH_VARIANTS = {"core after, explore 0.8": "as shipped", "core before, explore 0.2": "before issue 33"}


def shared_paths(config: Path) -> list[str]:
    """Overrides naming the config's ``../shared/`` paths absolutely: the committed configs write them relative to
    the repository root (no machine path in tracked files), the loader would read them relative to the config."""
    import yaml

    def walk(node: object, key: str) -> list[str]:
        if isinstance(node, dict):
            return [o for k, v in node.items() for o in walk(v, f"{key}.{k}" if key else str(k))]
        if isinstance(node, str) and node.startswith("../shared/"):
            return [f"{key}={(ROOT / node).resolve()}"]
        return []

    return walk(yaml.safe_load(config.read_text()), "")


def params_of(run: Path, units: pd.Series) -> np.ndarray:
    """Parameters of each row's structure ("" = the whole model), from the run's own config and cost model."""
    from rayfl.data import build_federated_dataset
    from rayfl.engine.search_only import meta_params
    from rayfl.experiment.loader import load_config
    from rayfl.models import InputSpec
    from rayfl.system.costs import CostOracle

    cfg = load_config(run / "config.yaml", ["output_dir=/tmp", *shared_paths(run / "config.yaml")])
    data = build_federated_dataset(cfg.data, cfg.seed, None)
    spec = InputSpec.of(data.input_kind, data.num_classes, data.x, data.meta)
    shapes = {k: tuple(t.shape) for k, t in meta_params(cfg, spec).items()}
    oracle = CostOracle(cfg.model, spec, cfg.train, shapes)
    assert oracle.elastic is not None and oracle.family is not None
    full = np.asarray(oracle.family.full_units)
    rows = np.stack([full if not u.strip() else np.array([int(x) for x in u.split()]) for u in units])
    params: np.ndarray = oracle.elastic.evaluate(rows).params
    return params


def search_only_lines(setting: int) -> list[str]:
    if not SEARCH_RECORDS.exists():
        return []
    records = [r for r in json.loads(SEARCH_RECORDS.read_text()) if r["setting"] == setting]
    lines = [
        "Search only (`rayfl search`, 30 rounds, seed of the YAML, no training; benchmarks/results/issue33):",
        "",
        "| core set-up | params / HeteroFL's | > HeteroFL | params / largest fitting | mem util | distinct |",
        "|---|---|---|---|---|---|",
    ]
    for variant, label in SEARCH_VARIANTS.items():
        for r in records:
            if r["variant"] == variant:
                lines.append(
                    f"| {label} | {r['vs_heterofl']:.2f}x | {100 * r['larger_than_heterofl']:.0f} % | "
                    f"{100 * r['vs_largest']:.0f} % | {100 * r['memory_util']:.0f} % | {r['distinct']} |"
                )
    return [*lines, ""]


def accuracy(run: Path) -> pd.Series:
    return pd.read_csv(run / "rounds.csv")["test_acc"].dropna()


def setting_lines(root: Path) -> list[str]:
    setting = int(re.sub(r"\D", "", root.name))
    prefix = f"setting{setting}-"
    lines = [f"## Setting {setting}", "", *search_only_lines(setting)]
    lines += [
        "| method | seed | acc (last 3) | acc final | sim h | mem util | bw util | failed | distinct "
        "| params / HeteroFL's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows: dict[str, list[str]] = {}
    gaps: list[str] = []
    chance: list[str] = []
    for seed_dir in sorted(root.glob("seed*")):
        seed = seed_dir.name.removeprefix("seed")
        runs = {p.name.removeprefix(prefix): p for p in sorted(seed_dir.iterdir()) if (p / "rounds.csv").exists()}
        clients = {
            m: pd.read_csv(p / "clients.csv", keep_default_na=False, dtype={"units": str, "failure": str})
            for m, p in runs.items()
        }
        ran = {m: c[c["failure"] == ""] for m, c in clients.items()}
        params = {m: params_of(runs[m], c["units"]) for m, c in ran.items()}
        ref = None
        if "heterofl" in ran:
            keys = pd.MultiIndex.from_frame(ran["heterofl"][["round_idx", "client_id"]])
            ref = pd.Series(params["heterofl"], index=keys)
        for m, p in runs.items():
            rounds = pd.read_csv(p / "rounds.csv")
            acc = rounds["test_acc"].dropna()
            rel = math.nan
            if ref is not None:
                idx = pd.MultiIndex.from_frame(ran[m][["round_idx", "client_id"]])
                mine = pd.Series(params[m], index=idx)
                both = mine.index.intersection(ref.index)
                rel = float((mine[both] / ref[both]).mean()) if len(both) else math.nan
            distinct = rounds["distinct_structures"]
            rows.setdefault(m, []).append(
                f"| {m} | {seed} | {100 * acc.tail(3).mean():.2f} | "
                f"{100 * acc.iloc[-1]:.2f} | {rounds['sim_time_s'].iloc[-1] / 3600:.2f} | "
                f"{100 * rounds['memory_util'].mean():.0f} % | {100 * rounds['bandwidth_util'].mean():.0f} % | "
                f"{int(rounds['clients_failed'].sum())} | "
                f"{'—' if distinct.isna().all() else int(distinct.iloc[-1])}"
                f" | {'—' if math.isnan(rel) else f'{rel:.2f}x'} |"
            )
        first = next(iter(runs.values()), None)
        if first is not None and (first / "summary.json").exists():
            chance.append(
                f"seed {seed}: {100 * json.loads((first / 'summary.json').read_text())['baseline_acc']:.1f} %"
            )
        if "heterofl" in runs and "model_search-no-distill" in runs:
            gap = accuracy(runs["model_search-no-distill"]).tail(3).mean() - accuracy(runs["heterofl"]).tail(3).mean()
            gaps.append(f"seed {seed}: {100 * gap:+.2f}")
    for m in sorted(rows, key=lambda m: (ORDER.index(m) if m in ORDER else len(ORDER), m)):
        lines += rows[m]
    if chance:
        lines += ["", "Most frequent test label (chance): " + "; ".join(chance) + "."]
    if gaps:
        lines += [
            "Core (no distillation) minus HeteroFL, accuracy of the last three evaluations, points: "
            + "; ".join(gaps)
            + ".",
        ]
    return [*lines, ""]


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or sorted(
        (p for p in (ROOT / "experiments" / "issue33").glob("setting*") if p.is_dir()),
        key=lambda p: int(re.sub(r"\D", "", p.name)),
    )
    lines = [
        "<!-- PYTHONPATH=$PWD python experiments/issue33/table.py > experiments/issue33/table.md -->",
        "# Issue 33 at CPU scale: accuracy (%) per setting and seed, beside the search statistics",
        "",
    ]
    for root in roots:
        lines += setting_lines(root)
    print("\n".join(lines).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
