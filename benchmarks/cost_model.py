"""Cost model: estimated against measured peak training memory, and specs evaluated per second.

Memory is measured in a fresh subprocess per case, on the CPU (or on CUDA with ``--device cuda``):

* CPU: glibc is told to serve every allocation of 64 KiB or more with its own ``mmap`` and to unmap it on free
  (``MALLOC_MMAP_THRESHOLD_``), so the resident set follows the live tensors page by page. The process warms up torch
  (a small conv step loads every kernel library), resets its peak resident set (``/proc/self/clear_refs``), then
  builds the sub-model, its optimizer and one batch and runs three SGD steps; the measured peak is the growth of
  ``VmHWM`` over the resident set just before the model was built.
* CUDA: ``torch.cuda.max_memory_allocated`` over the same steps, minus what was allocated before the model.

The estimate is ``CostModel`` with zero runtime overhead (that is exactly what both measurements leave out).

Run: ``python benchmarks/cost_model.py [--quick] [--device cpu|cuda]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # "specs per second on one core"
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np

CASES: list[tuple[str, str, float, int]] = [
    # (label, family constructor expression, uniform ratio, batch)
    ("ResNet18 x1", "resnet:18", 1.0, 64),
    ("ResNet18 x0.25", "resnet:18", 0.25, 64),
    ("ResNet34 x1", "resnet:34", 1.0, 64),
    ("ResNet34 x0.25", "resnet:34", 0.25, 64),
    ("ResNet152 x1", "resnet:152", 1.0, 64),
    ("ResNet152 x0.25", "resnet:152", 0.25, 64),
    ("ViT-tiny", "vit:tiny", 1.0, 64),
    ("BERT-tiny", "char_bert:tiny", 1.0, 64),
]


def make_family(name: str):  # type: ignore[no-untyped-def]
    kind, size = name.split(":")
    if kind == "resnet":
        from rayfl.config.model import ResNetConfig
        from rayfl.models.elastic.resnet import ResNetFamily

        return ResNetFamily(ResNetConfig(depth=int(size)))  # type: ignore[arg-type]
    if kind == "vit":
        from rayfl.config.model import ViTConfig
        from rayfl.models.elastic.vit import ViTFamily

        return ViTFamily(ViTConfig(size=size))  # type: ignore[arg-type]
    from rayfl.config.model import CharBertConfig
    from rayfl.models.elastic.bert import CharBertFamily

    return CharBertFamily(CharBertConfig(size=size), vocab_size=81, seq_len=80)  # type: ignore[arg-type]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure_child(family_name: str, ratio: float, batch: int, device: str) -> None:
    """Runs in the subprocess: prints the measured training memory in bytes as JSON."""
    import torch
    from torch import nn

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    dev = torch.device(device)
    warm = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Linear(30, 4), nn.LayerNorm(4)).to(dev)
    warm(torch.randn(2, 3, 32, 32, device=dev)).sum().backward()
    torch.optim.SGD(warm.parameters(), lr=0.1, momentum=0.9).step()
    fam = make_family(family_name)
    units = fam.space.units([ratio if ratio > 0 else 0.0] * len(fam.space.dims))
    tokens = family_name.startswith("char_bert")
    del warm
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        before = _rss_bytes()
    model = fam.build(units).to(dev)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randint(0, 81, (batch, 80), device=dev) if tokens else torch.randn(batch, 3, 32, 32, device=dev)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = out.float().pow(2).mean()
        loss.backward()
        opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = _hwm_bytes() - before
    print(json.dumps({"measured": peak, "units": list(units)}))


def measure(family_name: str, ratio: float, batch: int, device: str) -> int:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", MALLOC_TOP_PAD_="0")
    cmd = [sys.executable, __file__, "--child", family_name, str(ratio), str(batch), device]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"measuring {family_name} x{ratio} failed:\n{out.stderr[-2000:]}")
    return int(json.loads(out.stdout.strip().splitlines()[-1])["measured"])


def specs_per_second(family_name: str, n: int = 200_000) -> tuple[float, float]:
    from rayfl.models.elastic import cost
    from rayfl.models.elastic.cost import CostModel

    fam = make_family(family_name)
    cost._FITS.clear()  # time the fit from scratch (no in-process table, no disk cache)
    t0 = time.perf_counter()
    model = CostModel(fam, batch_size=64, use_disk_cache=False)
    fit_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    ratios = rng.choice(np.array([0.0625, 0.125, 0.25, 0.5, 1.0]), size=(n, len(fam.space.dims)))
    ratios[:, fam.space.skippable] *= rng.random((n, int(fam.space.skippable.sum()))) > 0.2  # some skipped blocks
    model.evaluate_ratios(ratios[:1000])  # warm-up
    t0 = time.perf_counter()
    model.evaluate_ratios(ratios)
    return n / (time.perf_counter() - t0), fit_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skip ResNet152 x1 (the slowest measurement)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, ratio, batch, device = args.child
        measure_child(name, float(ratio), int(batch), device)
        return
    from rayfl.models.elastic.cost import CostModel

    print(f"peak training memory, SGD momentum 0.9, measured on {args.device} (see module docstring for how)")
    columns = ("model", "batch", "params", "estimate MiB", "measured MiB", "error")
    widths = (16, 5, 11, 12, 12, 7)
    print(
        "| "
        + " | ".join(
            f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(columns, widths, strict=True))
        )
        + " |"
    )
    print(f"|{'-' * 18}|{'-' * 7}|{'-' * 13}|{'-' * 14}|{'-' * 14}|{'-' * 9}|")
    errors = []
    for label, name, ratio, batch in CASES:
        if args.quick and label == "ResNet152 x1":
            continue
        fam = make_family(name)
        cm = CostModel(fam, batch_size=batch, optimizer="sgd", momentum=0.9)
        units = fam.space.units([ratio] * len(fam.space.dims))
        est = cm.model_cost(units)
        measured = measure(name, ratio, batch, args.device)
        err = est["peak_memory"] / measured - 1.0
        errors.append(abs(err))
        print(
            f"| {label:<16} | {batch:>5} | {int(est['params']):>11,} | {est['peak_memory'] / 2**20:>12.1f} | "
            f"{measured / 2**20:>12.1f} | {err:>+7.1%} |",
            flush=True,
        )
    print(f"max |error| {max(errors):.1%}")
    for name in ("resnet:152", "resnet:18", "vit:tiny", "char_bert:tiny"):
        rate, fit_s = specs_per_second(name)
        print(f"{name}: {rate:,.0f} specs/s on one core (fitting the piece table took {fit_s:.2f} s, once)")


if __name__ == "__main__":
    main()
