"""How much training each tier's model got in one ``run_table.py`` table: SGD steps (batches), counted from the runs'
``clients.csv`` and, for FedorAS's supernet, replayed through the clients' path sampler (Eq. 3-4), which draws every
batch's path from (seed, round, client, batch) alone, so the replay is exactly what the run trained.

Prints, per tier: the steps that trained FedorAS's chosen path in the supernet as a whole and the fewest steps any of
its ops got; the fine-tuning steps of that path's model; rand-init's steps; the steps that reached FjORD's x p_t
sub-model (every client whose width is at least p_t trains it: the widths are nested).

    python experiments/fedoras/path_updates.py [--runs runs/fedoras] [--suffix -1]

(``--suffix -1``: the second table's run directories, e.g. ``fedoras_cpu-1``, as a second ``run_table.py`` names
them.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from rayfl.core.messages import TrainTask
from rayfl.engine.build import bind_algorithm, build_clock, build_setup
from rayfl.engine.phases import PhasedAlgorithm
from rayfl.experiment.loader import load_config
from rayfl.fl.methods.fedoras.algorithm import FedorAS
from rayfl.models.elastic.spec import first_k
from rayfl.models.supernet import SupernetFamily


def steps(num_examples: int, batch_size: int, epochs: int) -> int:
    return -(-num_examples // batch_size) * epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="runs/fedoras")
    parser.add_argument("--suffix", default="")
    args = parser.parse_args()
    root = Path(args.runs)

    def run_dir(name: str) -> Path:
        return root / f"{name}{args.suffix}"

    cfg = load_config(run_dir("fedoras_cpu") / "config.yaml")
    setup = build_setup(cfg)
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    assert isinstance(setup.algorithm, PhasedAlgorithm)
    supernet = setup.algorithm.phases[0].algorithm
    assert isinstance(supernet, FedorAS) and supernet.tables is not None
    family = supernet.family
    assert isinstance(family, SupernetFamily)
    examples = {c: len(setup.dataset.client_train(c)[1]) for c in range(setup.dataset.num_clients)}
    summary = json.loads((run_dir("fedoras_cpu") / "summary.json").read_text())
    chosen = [tuple(family.op_names.index(op) for op in t["path"]) for t in summary["phases"][2]["result"]["tiers"]]
    supernet_rounds = cfg.phases[0].rounds
    assert supernet.train.epochs == cfg.phases[0].epochs  # the phase's local epochs

    # supernet training, batch by batch: the path of every batch, as the clients drew it
    clients = pd.read_csv(run_dir("fedoras_cpu") / "clients.csv")
    path_steps: dict[tuple[int, ...], int] = {}
    op_steps = np.zeros((family.num_layers, family.num_ops), dtype=np.int64)
    total = 0
    for row in clients[clients.round_idx < supernet_rounds].itertuples():
        assignment = family.assignment(first_k(family.units_of_mask(supernet.subspace(int(row.round_idx)))))
        task = TrainTask(int(row.client_id), int(row.round_idx), cfg.seed, 0.0, assignment)
        for b in range(len(supernet.batch_sizes(examples[int(row.client_id)]))):
            drawn = supernet.path_for_batch(task, b)
            key = tuple(int(p) for p in drawn)
            path_steps[key] = path_steps.get(key, 0) + 1
            op_steps[np.arange(family.num_layers), drawn] += 1
            total += 1
    print(f"supernet: {total} steps over {len(path_steps)} distinct paths (of {family.num_ops**family.num_layers})")
    ops = ", ".join(f"{name} {op_steps[:, o].mean():.0f}" for o, name in enumerate(family.op_names))
    print(f"  steps per (layer, op), mean over layers: {ops}")

    def per_model(name: str, epochs: int, rounds: slice | None = None) -> list[int]:
        frame = pd.read_csv(run_dir(name) / "clients.csv")
        if rounds is not None:
            frame = frame[(frame.round_idx >= rounds.start) & (frame.round_idx < rounds.stop)]
        out = [0] * len(chosen)
        for row in frame.itertuples():
            out[int(row.model_id)] += steps(examples[int(row.client_id)], cfg.train.batch_size, epochs)
        return out

    finetune = per_model(
        "fedoras_cpu", cfg.phases[2].epochs or cfg.train.epochs, slice(cfg.rounds - cfg.phases[2].rounds, cfg.rounds)
    )
    rand_init = per_model("fedoras_rand_init", load_config(run_dir("fedoras_rand_init") / "config.yaml").train.epochs)

    fjord_cfg = load_config(run_dir("fedoras_fjord") / "config.yaml")
    assert fjord_cfg.data == cfg.data and fjord_cfg.seed == cfg.seed  # the same clients' samples
    fjord = pd.read_csv(run_dir("fedoras_fjord") / "clients.csv")
    last = fjord.units.map(lambda u: 10**9 if pd.isna(u) else int(str(u).split()[-1]))  # no units: the full model
    fjord_steps = np.array(
        [steps(examples[int(c)], fjord_cfg.train.batch_size, fjord_cfg.train.epochs) for c in fjord.client_id]
    )
    widths = sorted(set(last.tolist()))
    print(f"FjORD: {len(fjord)} client updates, at widths of {widths[:-1]} last-layer channels and the full model")

    print("| tier | chosen path's steps in the supernet | fewest steps of its ops | fine-tuning | rand-init | FjORD |")
    print("|---|---|---|---|---|---|")
    for tier, path in enumerate(chosen):
        fewest = int(op_steps[np.arange(family.num_layers), list(path)].min())
        reached = int(fjord_steps[last.to_numpy() >= widths[tier]].sum())
        row = [path_steps.get(path, 0), fewest, finetune[tier], rand_init[tier], reached]
        print(f"| {tier} | " + " | ".join(f"{v:,}" for v in row) + " |")


if __name__ == "__main__":
    main()
