"""Why utilisation falls as epsilon grows in rayfl's Figure 10 study: a check on the trials' per-client records.

    python experiments/sweeps/eps_tmax_monotone.py runs/sweeps/search-eps-tmax-setting5 [--out FILE]

Algorithm 2 keeps drawing random structures while a uniform draw exceeds epsilon (at most T_max draws) and adopts a
draw only when it fits and has more parameters; every draw also enters the pool, which persists across rounds. rayfl
reads a client's draws from ``derive_rng(seed, "search", round, client)`` and its budgets from per-round sources
(memory uniform, Wi-Fi tests drawn per round), so trials that differ only in epsilon see the same clients, budgets
and uniforms. With a smaller epsilon a client's draws are a superset (a longer prefix of the same sequence) and the
pool a superset too, so its choice can only have as many parameters or more: for every (round, client), the
assigned model's parameters - and its bytes, which are proportional to them - cannot rise with epsilon. This script
checks that on the records (bytes moved, ``bandwidth_need_mb``, stand for parameters) and reports, for each T_max and
each pair of neighbouring epsilons, the share of client-rounds where the larger epsilon got a larger model (must be 0)
and where it got a smaller one, and the same for memory need (not monotone: the criterion is parameters, not memory).
It then prints the table read the other way round (exploration probability = epsilon instead of 1 - epsilon), which
is how the paper's direction ("larger epsilon gives better utilisation") comes out of Algorithm 2.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import pandas as pd
import yaml


def load(sweep: Path) -> pd.DataFrame:
    """Every trial's client records with its epsilon and T_max (from the trial's config)."""
    frames = []
    for trial in sorted((sweep / "trials").iterdir()):
        if not (trial / "clients.csv").exists():
            continue
        summary = json.loads((trial / "summary.json").read_text()) if (trial / "summary.json").exists() else {}
        if summary.get("mode") != "search_only":
            continue
        cfg = yaml.safe_load((trial / "config.yaml").read_text())
        df = pd.read_csv(trial / "clients.csv")
        df["epsilon"] = float(cfg["algorithm"]["epsilon"])
        df["t_max"] = int(cfg["algorithm"]["t_max"])
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    df = load(args.sweep)
    lines = [
        "Per client-round, neighbouring epsilons compared (same T_max, same clients, budgets and draws):",
        "",
        "| T_max | epsilon a -> b | client-rounds | bytes larger at b | bytes smaller at b | memory larger at b "
        "| memory smaller at b |",
        "|---|---|---|---|---|---|---|",
    ]
    for t_max, group in df.groupby("t_max"):
        eps = sorted(group["epsilon"].unique())
        wide = {
            e: group[group["epsilon"] == e].set_index(["round_idx", "client_id"])[
                ["bandwidth_need_mb", "memory_need_mib"]
            ]
            for e in eps
        }
        for a, b in itertools.pairwise(eps):
            x, y = wide[a].align(wide[b], join="inner")
            n = len(x)
            tol = 1e-9
            lines.append(
                f"| {t_max} | {a:g} -> {b:g} | {n} "
                f"| {(y.bandwidth_need_mb > x.bandwidth_need_mb + tol).mean():.1%} "
                f"| {(y.bandwidth_need_mb < x.bandwidth_need_mb - tol).mean():.1%} "
                f"| {(y.memory_need_mib > x.memory_need_mib + tol).mean():.1%} "
                f"| {(y.memory_need_mib < x.memory_need_mib - tol).mean():.1%} |"
            )
    ran = df[df["failure"].isna() | (df["failure"] == "")]
    means = ran.groupby(["t_max", "epsilon"])[["memory_util", "bandwidth_util"]].mean().reset_index()
    lines += [
        "",
        "Mean utilisation of the clients that ran, by exploration probability p (rayfl: p = 1 - epsilon; the paper's",
        "sentence 'we adopt the searched structure with a probability of epsilon' read as p = epsilon):",
        "",
        "| T_max | epsilon (rayfl) | p = 1 - epsilon | memory util | bandwidth util |",
        "|---|---|---|---|---|",
    ]
    for row in means.itertuples():
        util = f"{row.memory_util:.1%} | {row.bandwidth_util:.1%}"
        lines.append(f"| {row.t_max} | {row.epsilon:g} | {1 - row.epsilon:g} | {util} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
