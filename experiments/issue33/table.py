"""Issue 33's accuracy table at CPU scale (setting 6): accuracy per seed beside the search statistics of each run.

    PYTHONPATH=$PWD python experiments/issue33/table.py [experiments/issue33/setting6]

Reads the runs ``run_setting6.sh`` wrote (``SEED_DIR/NAME/{config.yaml,rounds.csv,clients.csv}``) and prints, per
method and seed: the mean test accuracy of the last three evaluations (issue 17's reading), the final one, the
simulated hours, the mean memory and bandwidth utilisation of the clients that ran (the model's own need, overhead
excluded), the clients that failed, the distinct structures assigned, and the mean over client-rounds of the
parameters a client trained relative to the parameters HeteroFL's run of the same seed gave the same client in the
same round (both ran; budgets at each run's own simulated time, since setting 6 replays bandwidth traces).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def params_of(run: Path, units: pd.Series) -> np.ndarray:
    """Parameters of each row's structure ("" = the whole model), from the run's own config and cost model."""
    from rayfl.data import build_federated_dataset
    from rayfl.engine.search_only import meta_params
    from rayfl.experiment.loader import load_config
    from rayfl.models import InputSpec
    from rayfl.system.costs import CostOracle

    cfg = load_config(run / "config.yaml", ["output_dir=/tmp"])
    data = build_federated_dataset(cfg.data, cfg.seed, None)
    spec = InputSpec.of(data.input_kind, data.num_classes, data.x, data.meta)
    shapes = {k: tuple(t.shape) for k, t in meta_params(cfg, spec).items()}
    oracle = CostOracle(cfg.model, spec, cfg.train, shapes)
    assert oracle.elastic is not None and oracle.family is not None
    full = np.asarray(oracle.family.full_units)
    rows = np.stack([full if not u.strip() else np.array([int(x) for x in u.split()]) for u in units])
    params: np.ndarray = oracle.elastic.evaluate(rows).params
    return params


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "experiments/issue33/setting6")
    lines = [
        "| method | seed | acc (last 3) | acc final | sim h | mem util | bw util | failed | distinct "
        "| params / HeteroFL's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for seed_dir in sorted(root.glob("seed*")):
        runs = {p.name.removeprefix("setting6-"): p for p in sorted(seed_dir.iterdir()) if (p / "rounds.csv").exists()}
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
            lines.append(
                f"| {m} | {seed_dir.name.removeprefix('seed')} | {100 * acc.tail(3).mean():.2f} | "
                f"{100 * acc.iloc[-1]:.2f} | {rounds['sim_time_s'].iloc[-1] / 3600:.2f} | "
                f"{100 * rounds['memory_util'].mean():.0f} % | {100 * rounds['bandwidth_util'].mean():.0f} % | "
                f"{int(rounds['clients_failed'].sum())} | "
                f"{'—' if rounds['distinct_structures'].isna().all() else int(rounds['distinct_structures'].iloc[-1])}"
                f" | {'—' if math.isnan(rel) else f'{rel:.2f}x'} |"
            )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
