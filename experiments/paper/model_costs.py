"""What the models of an experiment cost under rayfl's cost model, and the budgets derived from it.

    .venv/bin/python experiments/paper/model_costs.py CONFIG [--reference FULL_CONFIG] [key=value ...]

For CONFIG's model it prints the full model, the smallest structure of the search space S (``algorithm.ratios``,
or ``[0, 0.5, 1]``), the named smallest structure (``algorithm.smallest``, Table 2's smallest client model) when
the config sets one, and every uniform width of S and of HeteroFL's rates: parameters, megabytes moved each way,
peak training memory at the config's batch size (plus the runtime overhead ``system.memory_overhead_mib``), the
bandwidth that moves the model down and up within ``system.comm_limit_s``, the training GFLOPs per sample and the
share of client-rounds whose budgets the structure fits (the clock's rule: memory need within the memory budget,
download plus upload within the communication limit; budgets read from the config's resource sources for
``clients_per_round`` clients in each of 20 rounds at their simulated start, with every round lasting the limit).
It then prints the ``levels`` values of HeteroFL's five rates (the budgets of paper 000 settings 1-2: the clients
of level i have exactly the memory and the bandwidth of the i-th model). With ``--reference`` (the full-size
config a CPU-sized one stands in for) it prints the factors that map the reference's budgets onto CONFIG's model:
the ratios of the two full models' memory (overhead excluded), bytes and FLOPs.

No data is loaded: the input shape comes from the data name (CIFAR-10 and synthetic 3x32x32 with 10 classes,
LEAF/FEMNIST 1x28x28 with 62 classes, MNIST 5k
1x32x32 with 10 classes, character models windows of ``data.seq_len`` with 81 classes). The YAML
comments in ``experiments/paper`` quote this script's output.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

from rayfl.engine.sampling import sample_clients
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.common.search import named_structure
from rayfl.fl.common.widths import HETEROFL_RATES
from rayfl.models.elastic import CostModel
from rayfl.models.families import build_family
from rayfl.models.inputs import InputSpec
from rayfl.system.costs import TRAIN_FLOPS_PER_FORWARD
from rayfl.system.resources import build_source

MIB = 2.0**20


@dataclass(frozen=True)
class Cost:
    params: float
    mb_each_way: float
    memory_mib: float  # without the runtime overhead
    gflops_per_sample: float  # training (forward + backward)


def budgets(cfg: ExperimentConfig, rounds: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memory (MiB), download and upload rates (Mbit/s) of the sampled clients over ``rounds`` rounds."""
    system = cfg.system
    memory = build_source(system.memory, "memory", cfg.seed, "memory")
    down = build_source(system.bandwidth_down, "bandwidth", cfg.seed, "bandwidth_down")
    up = down
    if system.bandwidth_up is not None:
        up = build_source(system.bandwidth_up, "bandwidth", cfg.seed, "bandwidth_up")
    population = max(cfg.data.num_clients, cfg.clients_per_round)
    mem, rate_down, rate_up = [], [], []
    for r in range(rounds):
        clients = np.asarray(sample_clients(cfg.seed, r, population, cfg.clients_per_round))
        t = r * system.comm_limit_s
        mem.append(memory.at(clients, t, r) / MIB)
        rate_down.append(down.at(clients, t, r) / 1e6)
        rate_up.append(up.at(clients, t, r) / 1e6)
    return np.concatenate(mem), np.concatenate(rate_down), np.concatenate(rate_up)


def input_spec(cfg: ExperimentConfig) -> InputSpec:
    """The model's input as the data would give it (see the module docstring)."""
    if cfg.model.name in ("char_bert", "char_lstm", "char_transformer"):
        return InputSpec("tokens", 81, (cfg.data.seq_len,))
    if cfg.data.name == "leaf":
        return InputSpec("image", 62, (1, 28, 28))
    if cfg.data.name == "mnist5k":
        return InputSpec("image", 10, (1, 32, 32))
    return InputSpec("image", 10, (3, 32, 32))


def structures(cfg: ExperimentConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(label, units) of the structures worth quoting: full, smallest of S, uniform widths."""
    space = build_family(cfg.model, input_spec(cfg)).space
    ratios = [float(r) for r in getattr(cfg.algorithm, "ratios", (0.0, 0.5, 1.0))]
    low = min(r for r in ratios if r > 0.0)
    smallest = space.units([0.0 if (d.skippable and 0.0 in ratios) else low for d in space.dims])
    out = [("full", tuple(int(s) for s in space.sizes)), (f"smallest of S={ratios}", smallest)]
    named = getattr(cfg.algorithm, "smallest", None)
    if named is not None:  # Table 2's smallest client model (algorithm.smallest)
        units = named_structure(build_family(cfg.model, input_spec(cfg)), named.ratio, named.blocks)
        out.append((f"algorithm.smallest {named.ratio:g} x {list(named.blocks)}", units))
    widths = sorted({r for r in ratios if r > 0.0} | set(HETEROFL_RATES), reverse=True)
    out += [(f"uniform width {r:g}", space.units([r] * len(space.dims))) for r in widths if r < 1.0]
    return out


def costs(cfg: ExperimentConfig) -> dict[str, Cost]:
    family = build_family(cfg.model, input_spec(cfg))
    model = CostModel(family, cfg.train.batch_size, cfg.train.optimizer, cfg.train.momentum)
    out = {}
    for label, units in structures(cfg):
        c = model.evaluate(np.asarray(units)[None, :])[0]
        out[label] = Cost(
            c["params"], c["bytes_down"] / 1e6, c["peak_memory"] / MIB, TRAIN_FLOPS_PER_FORWARD * c["flops"] / 1e9
        )
    return out


def round_up(value: float, digits: int = 3) -> float:
    """``value`` rounded up to ``digits`` significant digits (a budget at least the need)."""
    if value <= 0.0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return math.ceil(value / step - 1e-9) * step


def main(argv: list[str]) -> int:
    reference = None
    if "--reference" in argv:
        at = argv.index("--reference")
        reference = argv[at + 1]
        argv = argv[:at] + argv[at + 2 :]
    if not argv:
        print(__doc__)
        return 2
    cfg = load_config(argv[0], argv[1:])
    overhead, limit = cfg.system.memory_overhead_mib, cfg.system.comm_limit_s
    table = costs(cfg)
    print(f"{argv[0]}: {cfg.model.name}, batch {cfg.train.batch_size}, {cfg.train.optimizer}")
    print(f"  memory overhead {overhead:g} MiB, comm limit {limit:g} s")
    mem, down, up = budgets(cfg)
    print(
        f"{'structure':<36} {'params':>12} {'MB each way':>12} {'MiB (+ovh)':>11} {'Mbit/s':>9} {'GFLOP/sample':>13}"
        f" {'fits':>6}"
    )
    for label, c in table.items():
        mbps = 16.0 * c.mb_each_way / limit
        with np.errstate(divide="ignore"):
            comm_s = 8.0 * c.mb_each_way / down + 8.0 * c.mb_each_way / up
        fits = float(np.mean((c.memory_mib + overhead <= mem) & (comm_s <= limit)))
        print(
            f"{label:<36} {c.params:>12,.0f} {c.mb_each_way:>12.4f} {c.memory_mib + overhead:>11.1f}"
            f" {mbps:>9.4g} {c.gflops_per_sample:>13.4f} {100 * fits:>5.1f}%"
        )
    levels = [table["full"]] + [table[f"uniform width {r:g}"] for r in HETEROFL_RATES[1:]]
    # 7 significant digits: a band [values[i], values[i - 1]) then reaches model i - 1's need only in the last
    # 1e-6 of its width or so, where HeteroFL would get the larger rate (level_budget: band)
    memory = [round_up(c.memory_mib + overhead, 7) for c in levels]
    bandwidth = [round_up(16.0 * c.mb_each_way / limit, 7) for c in levels]
    print(f"levels of HeteroFL's rates {list(HETEROFL_RATES)}:")
    print(f"  memory values (MiB): [{', '.join(f'{v:.7g}' for v in memory)}]")
    print(f"  bandwidth values (Mbit/s): [{', '.join(f'{v:.7g}' for v in bandwidth)}]")
    if reference is not None:
        ref = costs(load_config(reference))["full"]
        full = table["full"]
        print(f"scale factors of the full model against {reference}:")
        print(f"  memory {full.memory_mib / ref.memory_mib:.4g}")
        print(f"  bytes {full.mb_each_way / ref.mb_each_way:.4g}")
        print(f"  flops {full.gflops_per_sample / ref.gflops_per_sample:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
