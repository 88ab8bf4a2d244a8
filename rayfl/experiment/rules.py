"""The rules of an experiment config that span fields, checked once the config is built from YAML.

``loader`` checks each value on its own (type, choice, bounds, path); the rules here relate values: a step
schedule lists increasing rounds, the model reads what the data gives, each resource source has the fields its kind
reads, trace files parse, phases add up to the run's rounds; a method's own rules live in its folder and are called
through the registry (``method_problems``). Each
problem is a key path and a reason; the loader turns the first into a ``ConfigError`` naming the file and line. The
checks that can only run after the data is loaded (how many clients it has, what input it gives) are here too, as
``clients_per_round_problem`` and ``model_input_problem``.

Imports neither torch nor Ray (``rayfl validate`` runs them); the cellnet and trace checks import what they need
only for configs that use them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayfl.config.fields import FLOAT32_MAX, WIDTH_RATIOS
from rayfl.config.model import CellNetConfig
from rayfl.config.model_rules import mlp_problems, supernet_problems
from rayfl.config.sections import BackendConfig, ServerOptimizerConfig
from rayfl.core.errors import KeyPath, Problem
from rayfl.core.files import is_storage_uri
from rayfl.experiment.schema import ExperimentConfig, method_activations
from rayfl.fl.api.rules import MethodRules
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.registry import METHODS, import_object

__all__ = [
    "DATA_INPUTS",
    "MAX_SHARDS",
    "MODEL_INPUTS",
    "KeyPath",
    "Problem",
    "clients_per_round_problem",
    "model_input_problem",
    "output_dir_problem",
    "run_name_problem",
    "semantic_problems",
    "trace_problems",
]


MAX_SHARDS = 64


def _gpu_host_problems(backend: BackendConfig) -> list[tuple[KeyPath, str]]:
    """A mixed pool (``backend.gpu_hosts``) names hosts that exist, reserves a GPU share for them and leaves each host
    to choose its device."""
    problems: list[tuple[KeyPath, str]] = []
    if backend.gpu_hosts > backend.num_hosts:
        problems.append(
            (("backend", "gpu_hosts"), f"must be <= backend.num_hosts ({backend.num_hosts}), got {backend.gpu_hosts}")
        )
    if backend.gpu_hosts > 0 and backend.gpus_per_host == 0:
        problems.append((("backend", "gpu_hosts"), "needs backend.gpus_per_host > 0 (the share a GPU host reserves)"))
    if backend.device == "cuda" and 0 < backend.gpu_hosts < backend.num_hosts:
        # a CPU-only host told to use CUDA would take a GPU that Ray never reserved for it
        problems.append(
            (("backend", "device"), "'cuda' would put the CPU-only hosts of a mixed pool on a GPU; use 'auto'")
        )
    return problems


def semantic_problems(cfg: ExperimentConfig) -> list[Problem]:
    """Every rule that spans fields, in a fixed order (the loader reports the first)."""
    problems: list[tuple[KeyPath, str]] = _learning_rate_problems(cfg)
    if cfg.backend.num_shards > MAX_SHARDS:
        problems.append((("backend", "num_shards"), f"must be <= {MAX_SHARDS}, got {cfg.backend.num_shards}"))
    if cfg.backend.kind == "ray" and cfg.backend.device == "cuda" and cfg.backend.gpus_per_host == 0:
        # a host that reserved no GPU share still sees every GPU (current Ray leaves CUDA_VISIBLE_DEVICES unset
        # at zero), so all hosts would crowd the first GPU behind the scheduler's back
        problems.append((("backend", "device"), "'cuda' on Ray needs backend.gpus_per_host > 0 (a reserved GPU share)"))
    problems += _gpu_host_problems(cfg.backend)
    if any(not 1.0 <= factor < float("inf") for factor in cfg.backend.slow_hosts):  # NaN fails too
        problems.append(
            (("backend", "slow_hosts"), f"every factor must be finite and >= 1, got {list(cfg.backend.slow_hosts)}")
        )
    if cfg.train.lr_schedule == "step":
        rounds = cfg.train.lr_decay_rounds
        if not rounds:
            problems.append(
                (
                    ("train", "lr_decay_rounds"),
                    "must list at least one round when train.lr_schedule is 'step'",
                )
            )
        for index in range(1, len(rounds)):
            if rounds[index] <= rounds[index - 1]:
                problems.append(
                    (
                        ("train", "lr_decay_rounds", index),
                        f"must be strictly increasing, got {rounds[index]} after {rounds[index - 1]}",
                    )
                )
                break
    comp = cfg.compression
    if comp.kind == "qsgd" and comp.levels > (1 << (comp.bits - 1)) - 1:
        problems.append(
            (
                ("compression", "levels"),
                f"{comp.levels} levels do not fit {comp.bits}-bit codes (a sign bit and {comp.bits - 1} magnitude bits "
                f"hold at most {(1 << (comp.bits - 1)) - 1})",
            )
        )
    if cfg.train.epochs < 1 and not cfg.train.noop:
        problems.append(
            (("train", "epochs"), "must be >= 1 (to measure the engine without training, set train.noop=true)")
        )
    if cfg.train.nesterov and (cfg.train.optimizer != "sgd" or cfg.train.momentum <= 0):
        problems.append((("train", "nesterov"), "needs train.optimizer 'sgd' and train.momentum > 0"))
    name_problem = run_name_problem(cfg.name)
    if name_problem:
        problems.append((("name",), name_problem))
    need, given = MODEL_INPUTS.get(cfg.model.name), DATA_INPUTS.get(cfg.data.name)
    if need is not None and given is not None and given not in need:
        problems.append((("model", "name"), _modality_reason(cfg.model.name, need, cfg.data.name, given)))
    elif cfg.train.sequence_loss == "all" and (
        (given is not None and given != "tokens") or (need is not None and "tokens" not in need)
    ):
        problems.append((("train", "sequence_loss"), _sequence_loss_reason(cfg, given or (need[0] if need else ""))))
    per_round: list[tuple[KeyPath, int]] = [(("clients_per_round",), cfg.clients_per_round)]
    per_round += [(("phases", i, "clients_per_round"), p.clients_per_round) for i, p in enumerate(cfg.phases)]
    for at, count in per_round:
        if count > cfg.data.num_clients > 0:
            # iid/dirichlet make exactly num_clients clients; natural partitions keep at most that many
            problems.append((at, f"{count} exceeds data.num_clients={cfg.data.num_clients}: lower {at[-1]}"))
    problems.extend(_data_problems(cfg))
    problems.extend(_resource_problems(cfg))
    problems.extend(_algorithm_problems(cfg))
    problems.extend(_phase_problems(cfg))
    problems.extend(_cellnet_problems(cfg))
    problems.extend(_policy_problems(cfg))
    problems.extend(_server_optimizer_problems(cfg))
    return problems


# the keys of server.optimizer that each optimizer reads (lr and name: all of them)
_OPTIMIZER_KEYS = {
    "sgd": ("momentum",),
    "adam": ("beta1", "beta2", "tau", "initial_accumulator"),
    "yogi": ("beta1", "beta2", "tau", "initial_accumulator"),
    "adagrad": ("beta1", "tau", "initial_accumulator"),
}


def _server_optimizer_problems(cfg: ExperimentConfig) -> list[tuple[KeyPath, str]]:
    """A key of ``server.optimizer`` set away from its default that the chosen optimizer does not read (it would be
    ignored in silence: ``momentum`` with adam, where ``beta1`` is the momentum)."""
    optimizer = cfg.server.optimizer
    default = ServerOptimizerConfig()
    reads = _OPTIMIZER_KEYS[optimizer.name]
    return [
        (("server", "optimizer", key), f"{optimizer.name!r} does not use it (it reads {', '.join(reads)})")
        for key in ("momentum", "beta1", "beta2", "tau", "initial_accumulator")
        if key not in reads and getattr(optimizer, key) != getattr(default, key)
    ]


def _policy_problems(cfg: ExperimentConfig) -> list[tuple[KeyPath, str]]:
    """What an asynchronous round policy (``server.policy: fedbuff | fedasync``) cannot be combined with."""
    server = cfg.server
    if server.policy not in ("fedbuff", "fedasync"):
        return []
    at: KeyPath = ("server", "policy")
    problems: list[tuple[KeyPath, str]] = []
    if cfg.phases:
        problems.append((at, f"{server.policy!r} runs one method: a run with phases is sync or overcommit"))
    if cfg.system.compute_time == "measured":
        problems.append((at, f"{server.policy!r} needs system.compute_time: modelled (arrivals are planned at start)"))
    if cfg.eval_all_devices:
        problems.append((at, f"{server.policy!r} keeps no per-device uploads: set eval_all_devices=false"))
    concurrency = server.concurrency or cfg.clients_per_round
    if cfg.data.num_clients > 0 and concurrency > cfg.data.num_clients:
        problems.append(
            (
                ("server", "concurrency"),
                f"{concurrency} clients in flight exceed data.num_clients={cfg.data.num_clients}",
            )
        )
    if server.buffer_size > concurrency:
        problems.append(
            (
                ("server", "buffer_size"),
                f"{server.buffer_size} exceeds the {concurrency} clients in flight: it never fills",
            )
        )
    if server.policy == "fedasync" and server.buffer_size not in (0, 1):
        problems.append((("server", "buffer_size"), "fedasync steps on every arrival: leave it 0 (or 1)"))
    return problems


_SPLITTERS = ("iid", "dirichlet", "shards", "pathological", "size_skew")


def _data_problems(cfg: ExperimentConfig) -> list[tuple[KeyPath, str]]:
    """Where the tables (``parquet``, ``hf``) come from and how they become clients; which sources the partitioners
    beyond iid and dirichlet split."""
    data = cfg.data
    problems: list[tuple[KeyPath, str]] = []
    if data.num_clients == 0 and (data.partition != "natural" or data.name == "synthetic"):
        makes = "data 'synthetic' makes" if data.partition == "natural" else f"partition {data.partition!r} makes"
        problems.append((("data", "num_clients"), f"0 keeps every client of a natural partition, but {makes} exactly "
                         "num_clients clients: set it to 1 or more"))  # fmt: skip
    if data.name == "parquet" and data.path is None:
        problems.append((("data", "path"), "data 'parquet' needs a Parquet, Arrow or CSV file, or a folder of them"))
    if data.name == "hf" and data.path is None and not data.hf_name:
        problems.append((("data", "path"), "data 'hf' needs data.path (a save_to_disk folder or a local data set "
                         "folder) or data.hf_name"))  # fmt: skip
    if data.name in ("parquet", "hf"):
        if data.partition == "natural" and not data.client_column:
            problems.append((("data", "partition"), f"'natural' needs data.client_column (the column of client ids); "
                             f"or split the rows with one of {', '.join(_SPLITTERS)}"))  # fmt: skip
    elif data.partition in ("shards", "pathological", "size_skew") and data.name not in ("cifar10", "custom"):
        problems.append((("data", "partition"), f"{data.partition!r} splits centralised data (cifar10, custom, "
                         f"parquet, hf); data {data.name!r} keeps its own split"))  # fmt: skip
    return problems


def _transform_problems(model: CellNetConfig) -> list[tuple[KeyPath, str]]:
    """The first step of a cellnet's log that does not apply (names and kinds of cells do not depend on the data's
    channels, classes or image size, so any stand-in sizes check them)."""
    from rayfl.models.cellnet.graph import base_graph  # imports torch: only for cellnet configs
    from rayfl.models.cellnet.transform import apply_step

    graph = base_graph(model, 3, 10, 32)
    for i, step in enumerate(model.transforms):
        try:
            graph = apply_step(graph, step)
        except ValueError as err:
            return [(("model", "transforms", i), str(err))]
    return []


def _cellnet_problems(cfg: ExperimentConfig) -> list[tuple[KeyPath, str]]:
    """A cellnet's sizes and transformation log; FedTrans needs a cellnet; per-client test sets are held out only
    from data that has none; a counts split is of synthetic Dirichlet data only."""
    problems: list[tuple[KeyPath, str]] = []
    model = cfg.model
    if isinstance(model, CellNetConfig):
        if any(c < 1 for c in model.channels):
            problems.append((("model", "channels"), f"must be positive widths, got {list(model.channels)}"))
        if model.base == "resnet" and model.channels and len(model.channels) != len(model.blocks):
            problems.append(
                (("model", "blocks"), f"needs one block count per stage width ({len(model.channels)}), got "
                 f"{len(model.blocks)}")
            )  # fmt: skip
        if model.base == "resnet" and (not model.blocks or min(model.blocks) < 1):
            problems.append((("model", "blocks"), "must list at least one block per stage"))
        if not problems:
            problems.extend(_transform_problems(model))
    if cfg.data.dirichlet_split == "counts" and (cfg.data.name != "synthetic" or cfg.data.partition != "dirichlet"):
        problems.append((("data", "dirichlet_split"), "'counts' splits the synthetic task by label counts (data.name: "
                         f"synthetic, partition: dirichlet), not data '{cfg.data.name}' with partition "
                         f"'{cfg.data.partition}': set it to 'pool'"))  # fmt: skip
    if (
        cfg.data.client_test_fraction > 0
        and cfg.data.partition == "natural"
        and cfg.data.name in ("shakespeare", "leaf")
    ):
        problems.append((("data", "client_test_fraction"), f"data '{cfg.data.name}' with a natural partition already "
                         "has a test set per client (data.test_fraction); set it to 0"))  # fmt: skip
    return problems


def _phase_problems(cfg: ExperimentConfig) -> list[tuple[KeyPath, str]]:
    """Phases' rounds add up to ``rounds``; the phases agree on the model's activation (``algorithm.act``: the model
    is the run's); the supernet model's own rules; each method's rules."""
    problems: list[tuple[KeyPath, str]] = []
    if cfg.phases and sum(p.rounds for p in cfg.phases) != cfg.rounds:
        total = sum(p.rounds for p in cfg.phases)
        problems.append((("rounds",), f"must equal the phases' rounds ({total}), got {cfg.rounds}"))
    wanted = method_activations(cfg)
    if cfg.phases and len(set(wanted.values())) > 1:
        first, *rest = sorted(wanted.items())
        other = next(i for i, act in rest if act != first[1])
        problems.append(
            (
                ("phases", other, "algorithm", "act"),
                f"gives the model activation {wanted[other]!r} but phases[{first[0]}] gives {first[1]!r}; the phases "
                "share one model: set the same algorithm.act in both",
            )
        )
    problems.extend(supernet_problems(cfg.model))
    problems.extend(mlp_problems(cfg.model))
    problems.extend(method_problems(cfg))
    return problems


def method_problems(cfg: ExperimentConfig) -> list[Problem]:
    """Each method's own rules (its registry row's ``rules``), once per algorithm section: the run's ``algorithm``, or
    every phase's when the run has phases."""
    sections: list[tuple[KeyPath, Any]] = [(("algorithm",), cfg.algorithm)] if not cfg.phases else []
    sections += [(("phases", i, "algorithm"), p.algorithm) for i, p in enumerate(cfg.phases)]
    problems: list[Problem] = []
    for at, algo in sections:
        rules = METHODS[algo.name].rules
        if rules is not None:
            check: MethodRules = import_object(rules)
            problems.extend(check(cfg, at, algo))
    return problems


# What each model reads and each data set gives; LEAF's task (images or characters) and a table's (images, tokens or
# feature vectors) are known only after loading. The MLP flattens images too.
MODEL_INPUTS: dict[str, tuple[str, ...]] = {
    "char_lstm": ("tokens",),
    "char_transformer": ("tokens",),
    "char_bert": ("tokens",),
    "cnn": ("image",),
    "resnet": ("image",),
    "vit": ("image",),
    "femnist_cnn": ("image",),
    "supernet": ("image",),
    "cellnet": ("image",),
    "mlp": ("features", "image"),
}
DATA_INPUTS: dict[str, str] = {"shakespeare": "tokens", "cifar10": "image", "synthetic": "image", "mnist5k": "image"}


def _modality_reason(model: str, need: tuple[str, ...], data: str, given: str) -> str:
    reason = f"model '{model}' reads {' or '.join(need)} inputs but data '{data}' gives {given}"
    if given == "features":  # a table's numeric columns
        return (
            f"{reason} (a vector of numbers per sample): set model.name=mlp, or data.input_shape to [C, H, W] to read "
            "them as images"
        )
    fits = ", ".join(sorted(m for m, kinds in MODEL_INPUTS.items() if given in kinds))
    return f"{reason}: pick one of {fits}"


def run_name_problem(name: str) -> str:
    """Why ``name`` cannot be a run directory inside ``output_dir`` ("" when it can)."""
    if not name or name.startswith(".") or any(c in name for c in "/\\") or not name.isprintable():
        return (
            f"run name {name!r} must be a plain directory name (no '/', '\\', leading '.' or '..'): "
            "runs are always written inside output_dir"
        )
    return ""


def output_dir_problem(output_dir: str | Path) -> str:
    """Why no run directory can be made under ``output_dir`` ("" when one can), looking at the file system without
    creating anything: the path or its nearest existing ancestor is a file, or that ancestor is not writable. A
    storage URI (``s3://``, ``gs://``) is checked where the run starts, by writing to it
    (``engine/persist/storage.py``): looking at it here would need the network."""
    if is_storage_uri(output_dir):
        return ""
    path = Path(output_dir)
    probe = path
    try:
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        is_dir = probe.is_dir()
    except OSError as err:
        return f"cannot look at {probe} ({err.strerror or err}): give a directory you can write"
    if not is_dir:
        where = "" if probe == path else f", so {str(path)!r} cannot be a directory"
        return f"{str(probe)!r} is a file, not a directory{where}: give a directory for the runs"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"cannot write in {str(probe)!r}: give a directory you can write"
    return ""


def _sequence_loss_reason(cfg: ExperimentConfig, input_kind: str) -> str:
    # the embedded default (Shakespeare) sets 'all', so overriding only data and model reaches this
    what = "feature vectors" if input_kind == "features" else "images"
    return (
        f"'all' trains on every position of a character sequence, but model '{cfg.model.name}' on data "
        f"'{cfg.data.name}' classifies {what}: set train.sequence_loss=last"
    )


def _learning_rate_problems(cfg: ExperimentConfig) -> list[tuple[KeyPath, str]]:
    """Learning rates that train float32 parameters stay within float32's range (torch's optimizers raise on a
    larger step, mid-run)."""
    rates: list[tuple[KeyPath, float]] = [(("train", "lr"), cfg.train.lr)]
    sections: list[tuple[KeyPath, Any]] = [(("algorithm",), cfg.algorithm)]
    sections.extend((("phases", i, "algorithm"), p.algorithm) for i, p in enumerate(cfg.phases))
    for at, algorithm in sections:
        for key, distill in _distill_sections(algorithm):
            rates.append(((*at, key, "lr"), distill.lr))
    return [
        (at, f"must be at most {FLOAT32_MAX:.4g} (float32's largest value), got {value!r}")
        for at, value in rates
        if value > FLOAT32_MAX
    ]


def _algorithm_problems(cfg: ExperimentConfig) -> list[tuple[KeyPath, str]]:
    """Width ratios lie in [0, 1] and include a positive value; rates and widths are positive."""
    problems: list[tuple[KeyPath, str]] = []
    algo = cfg.algorithm
    for f in dataclasses.fields(algo):  # the method's width ratio lists, marked in its config (``width_ratios``)
        if WIDTH_RATIOS in f.metadata:
            values = getattr(algo, f.name)
            problems.extend(_ratio_problems(("algorithm", f.name), values, f.metadata[WIDTH_RATIOS], allow_empty=False))
    if cfg.eval_widths:
        problems.extend(_ratio_problems(("eval_widths",), cfg.eval_widths, False, allow_empty=True))
    for key, distill in _distill_sections(algo):
        if distill.ratios:
            problems.extend(_ratio_problems(("algorithm", key, "ratios"), distill.ratios, True, allow_empty=True))
    return problems


def _distill_sections(algorithm: Any) -> list[tuple[str, DistillConfig]]:
    """The in-place distillation sections of a method's config (a field of type ``DistillConfig``), with their keys."""
    sections = ((f.name, getattr(algorithm, f.name)) for f in dataclasses.fields(algorithm))
    return [(key, value) for key, value in sections if isinstance(value, DistillConfig)]


def _ratio_problems(
    at: KeyPath, values: Sequence[float], zero_ok: bool, allow_empty: bool
) -> list[tuple[KeyPath, str]]:
    if not values:
        return [] if allow_empty else [(at, "must list at least one value")]
    for i, v in enumerate(values):
        if v < 0.0 or v > 1.0 or (v == 0.0 and not zero_ok):
            bound = "[0, 1]" if zero_ok else "(0, 1]"
            return [((*at, i), f"must lie in {bound}, got {v}")]
    if max(values) <= 0.0:
        return [(at, "must include a positive value")]
    return []


def _resource_problems(cfg: ExperimentConfig) -> list[tuple[KeyPath, str]]:
    """Each resource source needs the fields its kind reads."""
    problems: list[tuple[KeyPath, str]] = []
    system = cfg.system
    resources: list[tuple[KeyPath, Any]] = [
        (("system", name), getattr(system, name))
        for name in ("memory", "bandwidth_down", "bandwidth_up", "compute", "availability")
    ]
    resources.append((("system", "links", "error_rate"), system.links.error_rate))
    for at, res in resources:
        if res is None:
            continue
        name = at[-1]
        if res.source in ("uniform", "binary") and res.high < res.low:
            problems.append(((*at, "high"), f"must be >= low ({res.low}) for a {res.source} source, got {res.high}"))
        top = res.low if res.source == "constant" else res.high
        if res.source in ("constant", "uniform", "binary") and name != "availability" and top <= 0:
            problems.append(
                ((*at, "low" if res.source == "constant" else "high"), f"a {res.source} source needs a positive value")
            )
        if res.source == "levels" and not res.values:
            problems.append(((*at, "values"), "a levels source needs one value per level"))
        if res.id_bounds and res.source != "levels":
            problems.append(((*at, "id_bounds"), f"only a levels source reads id_bounds, not {res.source!r}"))
        if res.source == "levels" and res.id_bounds and len(res.id_bounds) != len(res.values) - 1:
            problems.append(
                (
                    (*at, "id_bounds"),
                    f"needs one bound fewer than values ({len(res.values) - 1}), got {len(res.id_bounds)}",
                )
            )
        for i in range(1, len(res.id_bounds)):
            if res.id_bounds[i] <= res.id_bounds[i - 1]:
                problems.append(((*at, "id_bounds", i), "must be strictly increasing"))
                break
        if res.source == "trace" and (res.file is None) == (res.directory is None):
            problems.append(((*at, "file"), "a trace source needs exactly one of file or directory"))
        if res.source == "empirical" and res.file is None:
            problems.append(((*at, "file"), "an empirical source needs the distribution file"))
        if res.source == "empirical" and res.format != "mobilebandwidth":
            problems.append(((*at, "format"), "an empirical source reads format 'mobilebandwidth'"))
        if res.source == "trace" and res.format == "mobilebandwidth":
            problems.append(((*at, "format"), "'mobilebandwidth' is a distribution: use source 'empirical'"))
    return problems


_RESOURCE_KINDS = (
    ("memory", "memory"),
    ("bandwidth_down", "bandwidth"),
    ("bandwidth_up", "bandwidth"),
    ("compute", "compute"),
    ("availability", "availability"),
)


def trace_problems(cfg: ExperimentConfig) -> list[tuple[KeyPath, str]]:
    """Trace and distribution files are read as a run would read them: they parse, hold the declared kind, and a
    directory's pattern matches at least one file (only numpy is imported, so this stays quick)."""
    sources: list[tuple[tuple[str, ...], Any, str]] = [
        (("system", name), getattr(cfg.system, name), kind) for name, kind in _RESOURCE_KINDS
    ]
    sources.append((("system", "links", "error_rate"), cfg.system.links.error_rate, "link_error"))
    for at, res, kind in sources:
        if res is None or res.source not in ("trace", "empirical"):
            continue
        problem = _trace_source_problem(res, kind, _files_stamp(res.file, res.directory, res.pattern))
        if problem:
            key, text = problem
            if key == "pattern":
                text += f": fix {'.'.join(at)}.pattern or the directory"
            return [((*at, key), text)]
    return []


def _files_stamp(file: str | None, directory: str | None, pattern: str) -> tuple[tuple[str, int, int], ...]:
    """Name, mtime and size of the files a source reads: a sweep checks each file once, until it changes."""
    paths = [Path(file)] if file is not None else sorted(Path(directory or ".").glob(pattern))
    stamps = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        stamps.append((str(path), stat.st_mtime_ns, stat.st_size))
    return tuple(stamps)


@functools.lru_cache(maxsize=256)
def _trace_source_problem(res: Any, kind: str, stamp: tuple[tuple[str, int, int], ...]) -> tuple[str, str] | None:
    """``(key, reason)`` when the trace or distribution files of ``res`` cannot be read as ``kind``, else None."""
    from rayfl.system.resources import build_source

    del stamp  # part of the cache key only
    try:
        build_source(res, kind, 0, "validate")
    except (ValueError, OSError, KeyError) as err:
        text = " ".join(str(err).split())
        if "no trace files matching" in text:
            return "pattern", text
        return ("file" if res.file is not None else "directory"), text + " (fix or replace the trace file)"
    return None


def clients_per_round_problem(cfg: ExperimentConfig, num_clients: int) -> str:
    """After loading: why ``clients_per_round`` (or a phase's) does not fit the clients the data really has
    (natural partitions drop users), "" when it fits."""
    if max([cfg.clients_per_round, *(p.clients_per_round for p in cfg.phases)]) > num_clients:
        return (
            f"{cfg.clients_per_round} exceeds the {num_clients} clients data '{cfg.data.name}' has after loading "
            "(users below data.min_samples are dropped): lower clients_per_round or data.min_samples"
        )
    return ""


def model_input_problem(cfg: ExperimentConfig, input_kind: str) -> Problem | None:
    """After loading: the model reads the kind of input the data gives (LEAF's task is detected from its files), and
    a loss over every sequence position is asked for only where there are sequences."""
    need = MODEL_INPUTS.get(cfg.model.name)
    if need is not None and input_kind not in need:
        return ("model", "name"), _modality_reason(cfg.model.name, need, cfg.data.name, input_kind)
    if input_kind != "tokens" and cfg.train.sequence_loss == "all":
        return ("train", "sequence_loss"), _sequence_loss_reason(cfg, input_kind)
    return None
