"""FedResCuE vs FedSlim vs FjORD vs HeteroFL under unstable links (paper 004, Sec. 5.4), CPU-sized.

Runs experiments/fedrescue/cpu.yaml once per method and error rate (er per column, constant; 0 = links that never
lose a column), evaluates the final global model's x0.25 ... x1 sub-models (first-k, batch statistics) on the test
set and writes experiments/fedrescue/results.md. Every method pads locally (Eq. 5), as in the paper.

    python experiments/fedrescue/run_table.py [--rounds N] [--seeds 0 1] [--out results.md]

With several seeds every number is the mean over them (accuracy also with its spread, max - min).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rayfl.algorithms.submodel import first_k
from rayfl.config import (
    ExperimentConfig,
    FedResCuEConfig,
    FedSlimConfig,
    FjORDConfig,
    HeteroFLConfig,
    ResourceConfig,
)
from rayfl.config_loader import load_config
from rayfl.engine.build import build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.models.elastic.spec import SubModelSpec
from rayfl.models.inputs import to_input

HERE = Path(__file__).parent
CAPACITIES = (0.25, 0.5, 0.75, 1.0)
ERROR_RATES = (0.0, 0.1, 0.2)


def methods(base: FedResCuEConfig) -> dict[str, Any]:
    return {
        "FedResCuE": base,
        "FedSlim": FedSlimConfig(capacities=base.capacities, ratios=base.ratios, num_ratios=base.num_ratios),
        "FjORD": FjORDConfig(widths=CAPACITIES, kd=True),
        "HeteroFL": HeteroFLConfig(rates=tuple(reversed(CAPACITIES)), label_mask=False, static_bn=False),
    }


def sub_model_accuracy(cfg: ExperimentConfig, params: dict[str, torch.Tensor]) -> list[float]:
    """Test accuracy of the global model's first-k x p sub-models (batch statistics, as trained)."""
    setup = build_setup(cfg)
    family = build_clock(cfg, setup).oracle.family
    assert family is not None
    ds = setup.dataset
    out = []
    for p in CAPACITIES:
        units = family.space.units(SubModelSpec.uniform(family.space, p).ratios)
        model = family.extract(params, first_k(units)).eval()
        correct = 0
        with torch.no_grad():
            for lo in range(0, len(ds.y_test), 500):
                x = to_input(ds.x_test[lo : lo + 500], setup.input_spec, torch.device("cpu"))
                correct += int((model(x).argmax(1).numpy() == np.asarray(ds.y_test[lo : lo + 500])).sum())
        out.append(correct / len(ds.y_test))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=0, help="override the YAML's rounds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default=str(HERE / "results.md"))
    args = parser.parse_args()
    base = load_config(HERE / "cpu.yaml")
    if args.rounds:
        base = dataclasses.replace(base, rounds=args.rounds)
    assert isinstance(base.algorithm, FedResCuEConfig)
    rows = []
    for er in ERROR_RATES:
        links = dataclasses.replace(base.system.links, error_rate=ResourceConfig(source="constant", low=er))
        for label, algorithm in methods(base.algorithm).items():
            accs, downs, ups, lost, began = [], [], [], [], time.perf_counter()
            for seed in args.seeds:
                cfg = dataclasses.replace(
                    base,
                    name=f"{label.lower()}-er{er:g}-seed{seed}",
                    seed=seed,
                    algorithm=algorithm,
                    system=dataclasses.replace(base.system, links=links),
                )
                result = run_experiment(cfg)
                accs.append(sub_model_accuracy(cfg, result.state.params))
                downs.append(sum(r.bytes_down for r in result.records) / 1e6)
                ups.append(sum(r.bytes_up for r in result.records) / 1e6)
                lost.append(sum(r.clients_failed for r in result.records))
                print(f"{label:10s} er={er:.1f} seed={seed} acc x.25/.5/.75/1 = {accs[-1]}", flush=True)
            acc = np.asarray(accs)
            rows.append(
                (
                    label,
                    er,
                    acc,
                    float(np.mean(downs)),
                    float(np.mean(ups)),
                    float(np.mean(lost)),
                    (time.perf_counter() - began) / len(args.seeds),
                )
            )
    lines = [
        f"# FedResCuE vs baselines under unstable links ({base.rounds} rounds, `{HERE.name}/cpu.yaml`, "
        f"seeds {', '.join(map(str, args.seeds))})",
        "",
        "Accuracy of the final global model's x p sub-models on the 1000 test images (mean over seeds, with several",
        "seeds the spread max - min in brackets); MB moved over the run (down, up, as sent: delivered columns plus",
        "the lost one); clients whose whole upload was lost; wall seconds per run, measured on a shared 2-core",
        "machine under other jobs' load.",
        "",
        "| method | er | x0.25 | x0.5 | x0.75 | x1 | mean | MB down | MB up | uploads lost | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, er, acc, down, up, failed, wall in rows:
        mean, spread = acc.mean(axis=0), acc.max(axis=0) - acc.min(axis=0)
        cells = " | ".join(
            f"{m:.3f} ({s:.3f})" if len(acc) > 1 else f"{m:.3f}" for m, s in zip(mean, spread, strict=True)
        )
        lines.append(
            f"| {label} | {er:g} | {cells} | {acc.mean():.3f} | {down:.2f} | {up:.2f} | {failed:.1f} | {wall:.0f} |"
        )
    lines += ["", "Mean accuracy over the four widths, drop from er = 0 to er = 0.2:", ""]
    for label in methods(base.algorithm):
        mean = {er: float(acc.mean()) for lab, er, acc, *_ in rows if lab == label}
        lines.append(f"- {label}: {mean[0.0]:.3f} -> {mean[0.2]:.3f} ({mean[0.2] - mean[0.0]:+.3f})")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
