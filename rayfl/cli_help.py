"""What ``rayfl --help`` and each sub-command's ``--help`` tell a user: what it does, its main options, an example.

Kept apart from ``cli.py`` (the wiring) so that the words can be read and changed in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMMANDS", "OVERVIEW", "Help"]

OVERVIEW = """\
rayfl simulates federated learning on heterogeneous devices: clients with their own data, memory, compute and
network budgets train a global model (FedAvg, HeteroFL, FedRolex, FjORD, FedHeN, FedTrans, FedorAS and more) on
your machine, in one process or on Ray.

An experiment is one YAML file (see examples/ and rayfl/configs/default.yaml); any key can be overridden on the
command line as key=value. A run writes its records, report, plots and trained models under output_dir/NAME.

common commands:
  rayfl run                                  the embedded default (FedAvg on Shakespeare)
  rayfl run examples/resnet18_synthetic.yaml rounds=5 backend.kind=ray
  rayfl validate my.yaml                     check a config without running it
  rayfl report runs/default                  tables and plots of finished runs

Run 'rayfl COMMAND --help' for a command's options and an example.
"""


@dataclass(frozen=True)
class Help:
    """One sub-command's one-line summary (in ``rayfl --help``), its description and its examples."""

    summary: str
    description: str
    examples: str

    @property
    def epilog(self) -> str:
        return f"examples:\n{self.examples}"


COMMANDS: dict[str, Help] = {
    "run": Help(
        "run an experiment (no FILE: the embedded default)",
        "Run an experiment from a YAML file, with key=value overrides (a.b=c sets key b of section a). The run's "
        "directory (output_dir/name) gets config.yaml, rounds.csv/.parquet, clients.csv, summary.json, report.md, "
        "plots, TensorBoard events when tensorboard is installed, and the trained models in models/ "
        "(load them with rayfl.load_model). Ctrl-C stops after the round in progress with a checkpoint; "
        "--resume continues it. backend.kind: auto (the default) runs small experiments in-process and large ones "
        "on Ray; the first line says which and why.",
        "  rayfl run\n"
        "  rayfl run examples/bert_tokens.yaml rounds=10 train.lr=0.01\n"
        "  rayfl run my.yaml backend.kind=ray backend.num_hosts=4 tracking.mlflow=true\n"
        "  rayfl run --resume runs/my-experiment",
    ),
    "validate": Help(
        "check a config without running it",
        "Read a config with its overrides and check every key, type, bound and rule between keys, as a run would "
        "before starting; a fault is one line naming the file, line and key. Nothing is trained or written.",
        "  rayfl validate examples/resnet18_synthetic.yaml\n  rayfl validate my.yaml algorithm.name=heterofl",
    ),
    "search": Help(
        "search-only run: assign models to budgets for the rounds, no training",
        "Run only the model-assignment side of a sub-model method (which sub-model each sampled client gets under "
        "its memory and bandwidth budgets, round after round) without training, to study budgets and failures "
        "quickly. Writes the same records as a run.",
        "  rayfl search experiments/fedoras/tiny.yaml rounds=100",
    ),
    "sweep": Help(
        "run a Ray Tune sweep file",
        "Run a hyperparameter sweep: a sweep file names a base experiment and the keys to vary (grid, choice, "
        "uniform, loguniform, randint); every trial is a full run with its own directory. key=value overrides set "
        "sweep fields, base.KEY=V the base experiment's. --check validates the sweep and every trial's config.",
        "  rayfl sweep --check experiments/sweeps/mini_methods.yaml\n"
        "  rayfl sweep experiments/sweeps/mini_methods.yaml base.rounds=2\n"
        "  rayfl sweep --resume SWEEP_DIR",
    ),
    "data": Help(
        "data sets: build one into the cache",
        "Prepare a data set ahead of a run, e.g. LEAF-style Shakespeare from the Project Gutenberg texts into the "
        "cache ($RAYFL_CACHE or ~/.cache/rayfl) that the embedded default reads.",
        "  rayfl data prepare shakespeare\n  rayfl data prepare shakespeare --edition both --seq-len 80",
    ),
    "report": Help(
        "tables and plots of finished runs",
        "Write report.md (a markdown table of final accuracy, wall and simulated time, failures) and accuracy "
        "plots for one or more run directories; --paper adds paper 000's layouts.",
        "  rayfl report runs/default\n  rayfl report runs/fedavg runs/heterofl --out reports/",
    ),
    "export": Help(
        "the trained models of a stopped run, from its checkpoint",
        "A run writes its models to RUN_DIR/models when it finishes or is stopped by Ctrl-C; one that ended in an "
        "error or was killed has only its checkpoints. export writes the same files (one safetensors file per global "
        "model, with its round and accuracy) from the newest checkpoint taken after an evaluated round, into OUT or "
        "RUN_DIR/models; load them with rayfl.load_model(OUT). The data set is built again from the run's "
        "config.yaml; run it where the run was started (a custom factory is imported from there).",
        "  rayfl export runs/my-experiment\n  rayfl export runs/my-experiment exported/",
    ),
    "traces": Help(
        "record, inspect, import and generate resource traces",
        "Resource traces give simulated clients their memory and network budgets over time: record this "
        "machine's, show a trace file, import public measurement sets, or synthesize traces.",
        "  rayfl traces synth memory mem.csv --seed 1\n"
        "  rayfl traces show traces/synthetic-memory-seed0.csv --plot m.png",
    ),
}
