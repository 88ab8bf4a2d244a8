"""Issue 33's search-only table: how much model the core method's search gives each client, before and after the
issue, at both readings of the paper's epsilon, on the six CPU settings (``experiments/paper/cpu``). Nothing is
trained: every variant is a ``rayfl search`` run (``run_search_only``, the same code path), and the script prints
the equivalent command line of each.

Per setting, six search-only runs of the same rounds (the sampled clients of a round are the same in all of them):

* ``core before, explore 0.2``: the set-up before issue 33 (settings 1-2: exact levels with the old rounded values;
  the space's smallest structure; a transformer block's heads and MLP searched separately; ``epsilon: 0.8`` read as
  Algorithm 2 reads it, i.e. explore with probability 0.2), and ``core before, explore 0.8`` (the same with
  epsilon read as App. E.1 / Fig. 10 read it);
* ``core after, explore 0.2`` and ``core after, explore 0.8`` (the shipped settings: band budgets in settings 1-2,
  Table 2's smallest client model, one ratio per transformer block, ``explore_probability: 0.8``);
* ``heterofl before`` / ``heterofl after``: HeteroFL's assignment under the same budgets (it does not search).

Columns, over every (round, client) pair that both runs sampled and where the core method's model fits:

* ``vs HeteroFL``: mean of core parameters / HeteroFL parameters of the same client in the same round (HeteroFL's
  run with the same budgets set-up), and the share of clients that get more than HeteroFL's model;
* ``vs largest``: mean of core parameters / the most parameters of a structure that fits the client's budgets
  (the clock's rule: peak memory with the runtime overhead within the memory budget, download + upload within the
  bandwidth budget). The largest fitting structure is taken over a reference set: every structure of the finer
  space when it has at most ``--exhaustive`` members (settings 5-6), else ``--samples`` uniform draws of it plus the
  uniform widths of S and every structure any variant assigned (settings 1-4: then a lower bound of the true
  largest, so the ratio is an upper bound);
* memory and bandwidth utilisation (the run's round means: the model's own need over the budget the runtime
  overhead leaves, and bytes over the bandwidth budget), the share of clients whose model fits, and the distinct
  structures assigned.

``system.server_time=none`` in every variant: a search-only round's server time is the search's wall time, which
would make the budgets of setting 6's traces depend on the host's speed; the table stays reproducible.

Run: ``python benchmarks/issue33_search_table.py [--settings 1 2 3 4 5 6] [--rounds 30] [--out DIR]`` writes each
run's records (``DIR/settingS/<variant>/``: ``config.yaml``, ``rounds.csv``, ``clients.csv``, ``summary.json``),
``DIR/table.md`` and ``DIR/records.json``; ``--table-only`` rebuilds the table from records already there. The
committed ones are in ``benchmarks/results/issue33/``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "experiments" / "paper" / "cpu"

# settings 1-2 before issue 33: exact levels at the values rounded up to 0.1 MiB / 3 digits
OLD_LEVELS = [
    "system.memory.level_budget=exact",
    "system.memory.values=[103,89.7,83.2,81.9,81.6]",
    "system.bandwidth_down.level_budget=exact",
    "system.bandwidth_down.values=[0.713,0.182,0.0475,0.0137,0.0054]",
]
OLD_SEARCH = [
    "algorithm.explore_probability=null",
    "algorithm.smallest=null",
    "algorithm.granularity=dimension",
]


@dataclass(frozen=True)
class Variant:
    label: str
    overrides: tuple[str, ...]


def variants(setting: int) -> list[Variant]:
    levels = OLD_LEVELS if setting in (1, 2) else []
    return [
        Variant("core before, explore 0.2", (*levels, *OLD_SEARCH, "algorithm.epsilon=0.8")),
        Variant("core before, explore 0.8", (*levels, *OLD_SEARCH, "algorithm.epsilon=0.2")),
        Variant("core after, explore 0.2", ("algorithm.explore_probability=0.2",)),
        Variant("core after, explore 0.8", ()),
        Variant("heterofl before", (*levels, "algorithm.name=heterofl")),
        Variant("heterofl after", ("algorithm.name=heterofl",)),
    ]


def run_name(variant: Variant) -> str:
    return variant.label.replace(",", "").replace(" ", "-")


def command(setting: int, variant: Variant, rounds: int) -> str:
    extra = " ".join([*variant.overrides, f"rounds={rounds}", "system.server_time=none"])
    return f"rayfl search experiments/paper/cpu/setting{setting}.yaml {extra} name={run_name(variant)} output_dir=DIR"


def run_variant(path: Path, variant: Variant, rounds: int, out: Path, dataset: object) -> Path:
    """One search-only run; its directory keeps the CSV records and the resolved config only."""
    from rayfl.engine.search_only import run_search_only
    from rayfl.experiment.loader import load_config

    common = [f"rounds={rounds}", "system.server_time=none", f"name={run_name(variant)}", f"output_dir={out}"]
    cfg = load_config(path, [*variant.overrides, *common])
    result = run_search_only(cfg, dataset=dataset)  # type: ignore[arg-type]
    assert result.run_dir is not None
    for extra in ("*.parquet", "client_accs.csv", "evals.csv"):
        for f in result.run_dir.glob(extra):
            f.unlink()
    return result.run_dir


def reference_units(cfg: object, family: object, exhaustive: int, samples: int, seed: int) -> np.ndarray:
    """Structures of the finer space (each dimension on its own) to find each client's largest fitting one in."""
    from rayfl.models.elastic.cost import units_from_ratios

    space = family.space  # type: ignore[attr-defined]
    ratios = sorted({float(r) for r in cfg.algorithm.ratios})  # type: ignore[attr-defined]
    positive = [r for r in ratios if r > 0]
    allowed = [ratios if d.skippable else positive for d in space.dims]
    count = math.prod(len(a) for a in allowed)
    if count <= exhaustive:
        grid = np.array(list(itertools.product(*allowed)), dtype=np.float64)
    else:
        rng = np.random.default_rng(seed)
        grid = np.stack([np.asarray(a)[rng.integers(len(a), size=samples)] for a in allowed], axis=1)
        grid = np.concatenate([grid, np.array([[r] * len(allowed) for r in positive])])
    units: np.ndarray = units_from_ratios(grid, space.sizes, space.skippable)
    return units


def parse_units(text: object, full: np.ndarray) -> np.ndarray:
    if not isinstance(text, str) or not text.strip():
        return full
    return np.array([int(u) for u in text.split()], dtype=np.int64)


def setting_table(
    setting: int, rounds: int, out: Path, exhaustive: int, samples: int, rerun: bool
) -> list[dict[str, object]]:
    import shutil

    import pandas as pd

    from rayfl.data import build_federated_dataset
    from rayfl.engine.search_only import meta_params
    from rayfl.experiment.loader import load_config
    from rayfl.models import InputSpec
    from rayfl.system.costs import CostOracle

    path = CPU / f"setting{setting}.yaml"
    base = load_config(path, [f"rounds={rounds}"])
    dataset = build_federated_dataset(base.data, base.seed, None)
    where = out / f"setting{setting}"
    if rerun and where.exists():
        shutil.rmtree(where)
    runs: dict[str, Path] = {}
    for v in variants(setting):
        runs[v.label] = run_variant(path, v, rounds, where, dataset) if rerun else where / run_name(v)
        print(f"  {command(setting, v, rounds)}", flush=True)
    spec = InputSpec.of(dataset.input_kind, dataset.num_classes, dataset.x, dataset.meta)
    params = meta_params(base, spec)
    shapes = {k: tuple(t.shape) for k, t in params.items()}
    oracle = CostOracle(base.model, spec, base.train, shapes, overhead_bytes=base.system.memory_overhead_mib * 2.0**20)
    cost, family = oracle.elastic, oracle.family
    assert cost is not None and family is not None
    full = np.asarray(family.full_units, dtype=np.int64)
    clients = {
        label: pd.read_csv(run_dir / "clients.csv", keep_default_na=False, dtype={"units": str, "failure": str})
        for label, run_dir in runs.items()
    }
    rows_units = {label: np.stack([parse_units(u, full) for u in df["units"]]) for label, df in clients.items()}
    ref = reference_units(base, family, exhaustive, samples, seed=setting)
    ref = np.unique(np.concatenate([ref, *rows_units.values()]), axis=0)
    rc = cost.evaluate(ref)
    order = np.argsort(-rc.params, kind="stable")
    ref_params, ref_mem, ref_comm = rc.params[order], rc.peak_memory[order], (rc.bytes_down + rc.bytes_up)[order]
    out_rows: list[dict[str, object]] = []
    for label, df in clients.items():
        if label.startswith("heterofl"):
            continue
        partner = "heterofl before" if "before" in label else "heterofl after"
        hf = clients[partner].set_index(["round_idx", "client_id"])
        hf_params = pd.Series(cost.evaluate(rows_units[partner]).params, index=hf.index)
        core_params = cost.evaluate(rows_units[label]).params
        fits = (df["failure"] == "").to_numpy()
        mem_b = df["memory_budget_mib"].to_numpy() * 2.0**20
        comm_b = df["bandwidth_budget_mb"].to_numpy() * 1e6
        ratio_hf, larger, ratio_best = [], [], []
        for i, (r, c) in enumerate(zip(df["round_idx"], df["client_id"], strict=True)):
            if not fits[i]:
                continue
            if (r, c) in hf.index and hf.loc[(r, c), "failure"] == "":
                ratio_hf.append(core_params[i] / hf_params.loc[(r, c)])
                larger.append(core_params[i] > hf_params.loc[(r, c)])
            ok = (ref_mem <= mem_b[i] * (1 + 1e-9)) & (ref_comm <= comm_b[i] * (1 + 1e-9))
            best = ref_params[int(np.argmax(ok))] if ok.any() else math.nan
            ratio_best.append(min(core_params[i] / best, 1.0) if best == best else math.nan)
        rounds_df = pd.read_csv(runs[label] / "rounds.csv")
        out_rows.append(
            {
                "setting": setting,
                "variant": label,
                "vs_heterofl": float(np.mean(ratio_hf)) if ratio_hf else math.nan,
                "larger_than_heterofl": float(np.mean(larger)) if larger else math.nan,
                "vs_largest": float(np.nanmean(ratio_best)) if ratio_best else math.nan,
                "memory_util": float(rounds_df["memory_util"].mean()),
                "bandwidth_util": float(rounds_df["bandwidth_util"].mean()),
                "fits": float(fits.mean()),
                "distinct": int(rounds_df["distinct_structures"].iloc[-1]),
                "hit_rate": float(rounds_df["hit_rate"].mean()),
                "reference": len(ref),
                "command": command(setting, next(v for v in variants(setting) if v.label == label), rounds),
            }
        )
    return out_rows


def markdown(rows: list[dict[str, object]]) -> str:
    head = (
        "| setting | variant | params / HeteroFL's | > HeteroFL | params / largest fitting | mem util | bw util "
        "| fits | distinct | hit rate |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )

    def pct(x: object) -> str:
        return "—" if not isinstance(x, float) or math.isnan(x) else f"{100 * x:.0f} %"

    lines = [
        f"| {r['setting']} | {r['variant']} | "
        + ("—" if math.isnan(float(r["vs_heterofl"])) else f"{float(r['vs_heterofl']):.2f}x")  # type: ignore[arg-type]
        + f" | {pct(r['larger_than_heterofl'])} | {pct(r['vs_largest'])} | {pct(r['memory_util'])} "
        f"| {pct(r['bandwidth_util'])} | {pct(r['fits'])} | {r['distinct']} | {pct(r['hit_rate'])} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--exhaustive", type=int, default=20000)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "issue33")
    parser.add_argument("--table-only", action="store_true", help="rebuild the table from the records in --out")
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    for s in args.settings:
        print(f"setting {s}:", flush=True)
        rows += setting_table(s, args.rounds, args.out, args.exhaustive, args.samples, not args.table_only)
    text = markdown(rows)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text)
    (args.out / "records.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
