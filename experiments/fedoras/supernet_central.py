"""Ablation: how fast the CPU-sized supernet learns at all, without federation.

Trains the supernet of cpu.yaml (stem 16, stages of 2-2-2 blocks) centrally on the pooled training images of cpu.yaml's
data (2,560 synthetic images), SGD lr 0.1 momentum 0.9, batches of 16 drawn uniformly, for ``--steps`` steps, either
on one fixed path (the largest, as a plain network) or with a fresh random path every batch (FedorAS's single-path
sampling, Eq. 3-4, under the largest path's FLOPs), for several op sets; prints the mean training loss of the last 50
steps and the test accuracy of the largest path. Separates what the weight-shared supernet needs from what the
federation adds.

    python experiments/fedoras/supernet_central.py [--steps 600] [--runs all:fixed all:random four:random ...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

from rayfl.config.model import SUPERNET_OPS, SupernetConfig
from rayfl.config.sections import DataConfig
from rayfl.data.synthetic import load_synthetic
from rayfl.fl.methods.fedoras.algorithm import op_tables
from rayfl.fl.methods.fedoras.sampling import sample_path
from rayfl.models import InputSpec, to_input
from rayfl.models.elastic.cost import CostModel
from rayfl.models.supernet import SupernetFamily

OP_SETS = {
    "all": SUPERNET_OPS,
    "four": ("ds3_e1", "mb3_e1", "mb3_e2", "identity"),
    "three": ("ds3_e1", "mb3_e2", "identity"),
}


def train(ops: tuple[str, ...], random_paths: bool, steps: int, seed: int = 0) -> tuple[float, float]:
    """(mean training loss of the last 50 steps, the largest path's test accuracy)."""
    data = DataConfig(name="synthetic", partition="iid", num_clients=20, synthetic_samples=128, synthetic_noise=0.3)
    ds = load_synthetic(data, seed)
    spec = InputSpec.of("image", 10, ds.x, ds.meta)
    cpu = torch.device("cpu")
    x, y = to_input(ds.x, spec, cpu), torch.from_numpy(ds.y)
    x_test, y_test = to_input(ds.x_test, spec, cpu), torch.from_numpy(ds.y_test)
    family = SupernetFamily(SupernetConfig(stem_channels=16, blocks_per_stage=(2, 2, 2), ops=ops), 3, 10, image_size=32)
    tables = op_tables(family, CostModel(family, 16))
    torch.manual_seed(seed)
    model = family.global_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    everything, largest = np.ones_like(tables.params, dtype=bool), np.argmax(tables.flops, axis=1)
    losses: list[float] = []
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(y), (16,), generator=gen)
        path = sample_path(tables, everything, tables.max_flops, rng) if random_paths else largest
        model.path = tuple(int(p) for p in path)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        losses.append(float(loss.detach()))
    model.path = tuple(int(p) for p in largest)
    model.eval()
    with torch.no_grad():
        batches = range(0, len(y_test), 128)
        correct = sum(int((model(x_test[i : i + 128]).argmax(1) == y_test[i : i + 128]).sum()) for i in batches)
    return float(np.mean(losses[-50:])), correct / len(y_test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--runs", nargs="+", default=["all:fixed", "all:random", "four:random", "three:random"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| ops | paths | steps | train loss (last 50) | largest path test acc |\n|---|---|---|---|---|")
    for run in args.runs:
        name, mode = run.split(":")
        began = time.perf_counter()
        loss, acc = train(OP_SETS[name], mode == "random", args.steps)
        print(
            f"| {len(OP_SETS[name])} ({name}) | {mode} | {args.steps} | {loss:.3f} | {100 * acc:.1f} % |"
            f" <!-- {time.perf_counter() - began:.0f} s -->",
            flush=True,
        )


if __name__ == "__main__":
    main()
