"""What a run checks before it starts anything that writes, beyond the config's own rules: that the method can use
the model it is given (a user's fixed model cannot serve a method that cuts sub-models), that the training set-up
asks of the model only what it can do (a loss over every sequence position needs a forward that returns them), and
that a table's columns, read from its files' metadata, give an input the model reads (``check_table_data``).

``rayfl validate`` and ``rayfl run`` call ``check_custom_model`` before Ray starts or a run directory exists, so each
fault is one located line (exit 2) and leaves nothing behind; the run calls it again once the data says what input it
gives (a custom data set's kind is known only then). Imports torch, for custom models only.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections import Counter
from typing import TYPE_CHECKING, Protocol

import numpy as np

from rayfl.config.model import CustomModelConfig, as_model_configs
from rayfl.core.errors import ConfigError, KeyPath, Problem
from rayfl.experiment.loader import check_model_input, format_key_path
from rayfl.experiment.rules import DATA_INPUTS
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.registry import build_algorithm

if TYPE_CHECKING:
    from rayfl.core.messages import Assignment, Params
    from rayfl.data.federated import FederatedDataset
    from rayfl.fl.api.algorithm import Algorithm
    from rayfl.models.inputs import InputSpec
    from rayfl.system.clock import SimClock

__all__ = [
    "algorithm_sections",
    "budgets_time_invariant",
    "check_custom_model",
    "check_distill_device",
    "check_family_fits",
    "check_someone_can_train",
    "check_table_data",
    "fixed_model_problem",
    "nobody_can_train_problem",
    "takes_all_positions",
]

_MIB, _MB = 2.0**20, 1e6
# the methods that train one whole model, for the error's advice
_FULL_MODEL_HINT = "fedavg (model: full), independent"


class Setup(Protocol):
    """What the check reads of a prepared run (``engine/build.py``'s ``Setup``)."""

    @property
    def algorithm(self) -> Algorithm: ...

    @property
    def dataset(self) -> FederatedDataset: ...

    @property
    def params(self) -> Params: ...


def algorithm_sections(cfg: ExperimentConfig) -> list[tuple[KeyPath, object]]:
    """The run's algorithm configs with their key paths: its own, then each phase's."""
    sections: list[tuple[KeyPath, object]] = [(("algorithm",), cfg.algorithm)]
    return sections + [(("phases", i, "algorithm"), p.algorithm) for i, p in enumerate(cfg.phases)]


def fixed_model_problem(cfg: ExperimentConfig) -> Problem | None:
    """The first algorithm of the run (its own, or a phase's) that cuts sub-models out of an elastic family, which a
    ``model.name: custom`` model does not have; ``None`` when every one trains the whole model."""
    for at, config in algorithm_sections(cfg):
        if build_algorithm(config, cfg.train).needs_family():
            name = getattr(config, "name", "?")
            return (*at, "name"), (
                f"{name!r} cuts sub-models out of an elastic family, but model.name: custom is a fixed model: use a "
                f"method that trains the whole model ({_FULL_MODEL_HINT}), or write an ElasticFamily (docs/models.md: "
                "'Your own model with sub-model methods') for your architecture"
            )
    return None


def takes_all_positions(model: object) -> bool:
    """Whether ``model``'s forward accepts ``all_positions=True`` (``train.sequence_loss: all`` calls it so)."""
    try:
        params = inspect.signature(model.forward).parameters  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False
    return "all_positions" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


# one sample's shape where only the data's name is known: what the built-in sources give (the structure checks below
# read a family's stages and blocks, which do not depend on it)
_STAND_IN_SHAPES: dict[str, tuple[int, ...]] = {"mnist5k": (1, 32, 32), "leaf": (1, 28, 28)}


def _stand_in_spec(cfg: ExperimentConfig) -> InputSpec | None:
    """An input of the kind and shape the run's data gives, for building its model's family before the data is
    loaded; ``None`` when the model has no family or its input is known only from the data."""
    from rayfl.experiment.rules import MODEL_INPUTS
    from rayfl.models.inputs import InputSpec

    need = MODEL_INPUTS.get(cfg.model.name)
    kind = DATA_INPUTS.get(cfg.data.name) or (need[0] if need else None)
    if kind is None:
        return None
    shape = tuple(cfg.data.input_shape)
    if kind == "tokens":
        return InputSpec("tokens", 81, (cfg.data.seq_len,))
    if kind == "image":
        return InputSpec("image", 10, shape if len(shape) == 3 else _STAND_IN_SHAPES.get(cfg.data.name, (3, 32, 32)))
    return InputSpec(kind, 10, shape if len(shape) == 1 else (16,))


def check_family_fits(cfg: ExperimentConfig) -> None:
    """Raise a ``ConfigError`` at the key when a method of the run (its own, or a phase's) names a structure its
    model's family cannot hold (``Algorithm.family_problems``: a smallest model with more stages or blocks than the
    network has), from the config alone: the family is built for an input of the data's kind and shape, no weights,
    no data. A model whose family cannot be built that way (a custom model, a family that needs the data) is left to
    the run, which asks again on the real family (``bind_server``)."""
    if isinstance(cfg.model, CustomModelConfig):
        return
    spec = _stand_in_spec(cfg)
    if spec is None:
        return
    from rayfl.models.families import build_family

    family = None
    for at, config in algorithm_sections(cfg):
        algorithm = build_algorithm(config, cfg.train)
        if not algorithm.needs_family():
            continue
        if family is None:
            try:
                family = build_family(cfg.model, spec)
            except Exception:  # the run builds it on the real data and says what is wrong there
                return
        for key, reason in algorithm.family_problems(family):
            raise ConfigError(reason, format_key_path((*at, *key)))


def check_custom_model(cfg: ExperimentConfig, input_kind: str | None = None) -> None:
    """Raise a ``ConfigError`` at the key to change when a custom model cannot serve the run's method, or cannot give
    the per-position logits ``train.sequence_loss: all`` trains on (token data; ``input_kind`` ``None``: as the data
    set's name says, unknown for custom data)."""
    if not isinstance(cfg.model, CustomModelConfig):
        return
    problem = fixed_model_problem(cfg)
    if problem is not None:
        raise ConfigError(problem[1], format_key_path(problem[0]))
    kind = input_kind or DATA_INPUTS.get(cfg.data.name)
    if kind != "tokens" or cfg.train.sequence_loss != "all":
        return
    from rayfl.models.custom import check_model_factory

    if not takes_all_positions(check_model_factory(cfg.model, kind)):
        raise ConfigError(
            f"'all' trains every position of a sequence, calling forward(x, all_positions=True), which "
            f"{cfg.model.factory!r}'s forward does not take: set train.sequence_loss=last (the last position's "
            "logits [batch, num_classes], what forward(x) returns), or give forward an all_positions argument that "
            "returns [batch, seq_len, num_classes]",
            "train.sequence_loss",
        )


def check_table_data(cfg: ExperimentConfig) -> None:
    """``data.name: parquet``: raise what the run would refuse, from the files' schemas, footers and statistics alone
    (``data/table_schema.describe_table``; no row is read): a missing or unusable column, a shape ``data.input_shape``
    cannot give, too few rows for ``data.num_clients``, a model that cannot read the input (its family built for it on
    the meta device), a custom model whose output does not fit the number of classes (when the metadata tells it)."""
    if cfg.data.name != "parquet":
        return
    from rayfl.data.table_schema import describe_table

    summary = describe_table(cfg.data)
    check_model_input(cfg, summary.input_kind)
    check_custom_model(cfg, summary.input_kind)
    if summary.sample_shape is None:  # lists of varying length, encoded images: only the rows say
        return
    import torch

    from rayfl.models import InputSpec, build_model
    from rayfl.models.custom import check_model_output

    spec = InputSpec(summary.input_kind, summary.num_classes or 2, summary.sample_shape)
    if isinstance(cfg.model, CustomModelConfig):
        if summary.num_classes is not None:
            check_model_output(cfg.model, spec)
        return
    try:
        with torch.device("meta"):
            build_model(cfg.model, spec)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"{err} (data {summary.where})", "model.name") from None
    except Exception:  # a layer without a meta kernel, say: the run builds the model on the real data
        return


def check_distill_device(cfg: ExperimentConfig, cuda_available: bool | None = None) -> None:
    """Raise a ``ConfigError`` at ``distill.device`` when a method of the run distils on CUDA (``cuda``) and this
    process, the driver that distils, sees no GPU (``cuda_available``: as torch says when ``None``); before round 0,
    not after it."""
    for at, config in algorithm_sections(cfg):
        distill = getattr(config, "distill", None)
        if distill is None or not distill.enabled or distill.device != "cuda":
            continue
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        if not cuda_available:
            raise ConfigError(
                "'cuda' distils on the driver's GPU, but this process sees no CUDA device: use 'cpu', or 'auto' "
                "(the GPU where there is one)",
                format_key_path((*at, "distill", "device")),
            )


# round starts at which a run's budgets are looked at before it starts (spread over its rounds)
_CENSUS_ROUNDS = 16
_CHUNK = 512  # clients planned at once at first (a run where someone fits stops at its first chunk) ...
_MAX_CHUNK = 1 << 16  # ... then twice as many each chunk where nobody did, up to this
_FIT_CAUSES = {"memory": "memory", "bandwidth": "bandwidth", "compute": "compute", "memory_dip": "memory"}


def nobody_can_train_problem(cfg: ExperimentConfig, setup: Setup, clock: SimClock) -> str:
    """Why no client of the run could ever train the model its method gives everyone ("" when some client can): a
    method that trains one fixed model and enforces budgets (FedAvg's ``budgets: enforce``) would otherwise fail
    every sampled client in every round, and leave the model as it started, without an error.

    "Ever" is checked on every client's budgets at ``_CENSUS_ROUNDS`` round starts spread over the run, each at the
    simulated time it would have if every round lasted ``system.comm_limit_s`` (round-seeded budgets and traces are
    looked at over that span); where every budget source is time-invariant (``budgets_time_invariant``) the first
    round start alone. Methods that pick a sub-model per client, and phased runs, are not checked here."""
    algorithm = setup.algorithm
    if cfg.phases or algorithm.needs_family():
        return ""
    num_clients = setup.dataset.num_clients
    state = algorithm.init_state(setup.params)
    rounds = sorted({int(r) for r in np.linspace(0, max(cfg.rounds - 1, 0), min(cfg.rounds, _CENSUS_ROUNDS))})
    if budgets_time_invariant(clock):
        rounds = rounds[:1]  # every round start would give every client the budgets of the first
    now, causes = clock.now, Counter[str]()
    largest = {"memory": 0.0, "bandwidth": 0.0}
    need = (math.inf, math.inf)
    try:
        for round_idx in rounds:
            clock.now = round_idx * cfg.system.comm_limit_s
            # chunks made as they are looked at: a run where clients fit stops at the first, whatever the population
            lo, size = 0, _CHUNK
            while lo < num_clients:
                chunk = np.arange(lo, min(num_clients, lo + size))
                lo, size = lo + size, min(2 * size, _MAX_CHUNK)
                views = clock.check_in(round_idx, chunk, [setup.dataset.num_examples(int(c)) for c in chunk])
                given = algorithm.assign(state, round_idx, views)
                if not all(a.enforce_budgets for a in given.values()):
                    return ""  # budgets ignored: everyone trains
                unenforced: dict[int, Assignment] = {}  # one copy per distinct assignment (FedAvg: one in all)
                free = {
                    c: unenforced.get(id(a))
                    or unenforced.setdefault(id(a), dataclasses.replace(a, enforce_budgets=False))
                    for c, a in given.items()
                }
                plan = clock.plan(round_idx, views, free, as_model_configs(state.models))
                # a client offline at check-in (no network, or not available) is not a budget too small: its failure
                # is "unavailable" or "no_network" whatever the model, so such runs are left to run (and say so per
                # round)
                offline = ("unavailable", "no_network")
                if any(not e or f in offline for e, f in zip(plan.over_budget, plan.failure, strict=True)):
                    return ""
                causes.update(_FIT_CAUSES.get(e, e) for e in plan.over_budget)
                largest["memory"] = max(largest["memory"], float(np.max(plan.memory_budget)))
                largest["bandwidth"] = max(largest["bandwidth"], float(np.max(plan.bandwidth_budget)))
                need = (min(need[0], float(np.min(plan.memory_need))), min(need[1], float(np.min(plan.bandwidth_need))))
    finally:
        clock.now = now
    cause = causes.most_common(1)[0][0]
    if cause == "memory":
        detail = (
            f"it needs {need[0] / _MIB:.1f} MiB of memory, the largest budget is {largest['memory'] / _MIB:.1f} MiB"
        )
    elif cause == "bandwidth":
        detail = (
            f"it moves {need[1] / _MB:.2f} MB per round, the most any client moves within system.comm_limit_s="
            f"{cfg.system.comm_limit_s:g} s is {largest['bandwidth'] / _MB:.2f} MB"
        )
    else:
        detail = "its training FLOPs exceed every client's compute budget (system.compute_limit_s)"
    return (
        f"no client can ever train: the model {algorithm.name!r} gives every client exceeds every client's {cause} "
        f"budget at every round start looked at ({detail}), so every round would fail all its clients and leave the "
        f"model unchanged: set algorithm.budgets=ignore to train every sampled client regardless of its budgets, use "
        f"a method that gives each client a sub-model that fits (heterofl, fedrolex, fjord, ...), or a smaller model"
    )


def budgets_time_invariant(clock: SimClock) -> bool:
    """Whether every budget the check reads (memory, both links' bandwidth, compute, availability) is the same for
    a client at every round start: then one round start decides for all of them."""
    sources = (clock.memory, clock.down, clock.up, clock.compute, clock.availability)
    return all(source.time_invariant for source in sources)


def check_someone_can_train(cfg: ExperimentConfig, setup: Setup, clock: SimClock) -> None:
    """``nobody_can_train_problem`` as a ``ConfigError`` on ``algorithm.budgets`` (before the run directory exists)."""
    reason = nobody_can_train_problem(cfg, setup, clock)
    if reason:
        raise ConfigError(reason, "algorithm.budgets")
