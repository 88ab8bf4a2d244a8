"""What ``rayfl validate`` checks about FedorAS runs (paper 003) before anything is built: the supernet and its
realised paths, the tiers, and the order of the three phases (supernet training, search, per-tier fine-tuning).

Imports neither torch nor Ray (the loader calls it on every validate). Each problem is a key path and a reason; the
loader turns them into one-line errors naming the file and line.
"""

from __future__ import annotations

from typing import Any

from rayfl.config import (
    SUPERNET_OPS,
    ExperimentConfig,
    FedorASConfig,
    FedorASFinetuneConfig,
    FedorASSearchConfig,
    FedorASTiersConfig,
    SupernetConfig,
)

__all__ = ["fedoras_problems"]

KeyPath = tuple[str | int, ...]
Problem = tuple[KeyPath, str]
_FEDORAS = FedorASConfig | FedorASSearchConfig | FedorASFinetuneConfig


def fedoras_problems(cfg: ExperimentConfig) -> list[Problem]:
    """The supernet's ops and path are known ones; FedorAS phases run on the whole supernet, in order, with valid
    tiers and paths."""
    problems = _supernet_problems(cfg.model)
    sections: list[tuple[KeyPath, Any]] = [(("algorithm",), cfg.algorithm)] if not cfg.phases else []
    sections += [(("phases", i, "algorithm"), p.algorithm) for i, p in enumerate(cfg.phases)]
    for at, algo in sections:
        if not isinstance(algo, _FEDORAS):
            continue
        if not isinstance(cfg.model, SupernetConfig):
            problems.append(((*at, "name"), f"{algo.name!r} needs model.name: supernet, got {cfg.model.name!r}"))
        elif cfg.model.path:
            problems.append((("model", "path"), f"{algo.name!r} works on the whole supernet: leave model.path empty"))
        before = _previous(cfg, at)
        if isinstance(algo, FedorASConfig):
            problems.extend(_tier_problems(cfg, (*at, "tiers"), algo.tiers))
        elif isinstance(algo, FedorASSearchConfig):
            problems.extend(_search_problems(cfg, at, algo, before))
        elif isinstance(algo, FedorASFinetuneConfig):
            problems.extend(_finetune_problems(cfg, at, algo, before))
    return problems


def _previous(cfg: ExperimentConfig, at: KeyPath) -> Any:
    """The algorithm of the phase before the section at ``at`` (None for a run's first or only algorithm)."""
    if at[0] != "phases" or int(at[1]) == 0:
        return None
    return cfg.phases[int(at[1]) - 1].algorithm


def _supernet_problems(model: Any) -> list[Problem]:
    if not isinstance(model, SupernetConfig):
        return []
    problems: list[Problem] = []
    for i, op in enumerate(model.ops):
        if op not in SUPERNET_OPS:
            problems.append((("model", "ops", i), f"unknown op {op!r}; known: {', '.join(SUPERNET_OPS)}"))
    if not model.blocks_per_stage or min(model.blocks_per_stage) < 1:
        problems.append((("model", "blocks_per_stage"), "must list at least one stage of at least one block"))
    elif model.path:
        problems.extend(_path_problems(model, ("model", "path"), model.path))
    return problems


def _path_problems(model: SupernetConfig, at: KeyPath, path: tuple[str, ...]) -> list[Problem]:
    blocks = sum(model.blocks_per_stage)
    if len(path) != blocks:
        return [(at, f"must name one op per searchable block ({blocks}), got {len(path)}")]
    return [((*at, i), f"op {op!r} is not one of model.ops") for i, op in enumerate(path) if op not in model.ops]


def _tier_problems(cfg: ExperimentConfig, at: KeyPath, tiers: FedorASTiersConfig) -> list[Problem]:
    problems: list[Problem] = []
    shares = tiers.shares
    if not shares or min(shares) <= 0.0 or abs(sum(shares) - 1.0) > 1e-6:
        problems.append(((*at, "shares"), f"must be positive and sum to 1, got {list(shares)}"))
    if tiers.bracket_low >= tiers.bracket_high:
        problems.append(((*at, "bracket_low"), "must be below bracket_high"))
    if tiers.by == "compute" and cfg.system.compute.source in ("none", "constant"):
        problems.append(
            (
                (*at, "by"),
                f"'compute' ranks clients by system.compute, but source {cfg.system.compute.source!r} gives every "
                "client the same speed: use levels, uniform, binary, trace or empirical",
            )
        )
    return problems


def _search_problems(cfg: ExperimentConfig, at: KeyPath, algo: FedorASSearchConfig, before: Any) -> list[Problem]:
    problems: list[Problem] = []
    if not isinstance(before, FedorASConfig | FedorASSearchConfig):
        problems.append(((*at, "name"), "'fedoras_search' must follow a 'fedoras' phase"))
    if algo.validation == "held_out" and cfg.data.val_fraction <= 0:
        problems.append(
            (
                (*at, "validation"),
                "'held_out' scores paths on the held-out validation set: set data.val_fraction above 0 "
                "(or validation: train, the clients' training data)",
            )
        )
    if 0 < algo.max_evaluations < algo.population:
        problems.append(((*at, "max_evaluations"), f"must be 0 or at least population ({algo.population})"))
    return problems


def _finetune_problems(cfg: ExperimentConfig, at: KeyPath, algo: FedorASFinetuneConfig, before: Any) -> list[Problem]:
    problems: list[Problem] = []
    tiers = algo.tiers
    if before is None:
        if tiers is None:
            problems.append(((*at, "tiers"), "a run that starts with fedoras_finetune needs its own tiers"))
        if algo.init == "supernet":
            problems.append(((*at, "init"), "'supernet' copies a trained supernet: it needs a fedoras phase before"))
    elif not isinstance(before, FedorASConfig | FedorASSearchConfig):
        problems.append(((*at, "name"), "'fedoras_finetune' must follow a 'fedoras' or 'fedoras_search' phase"))
    elif tiers is not None:
        problems.append(((*at, "tiers"), "is inherited from the fedoras phase before: leave it unset"))
    if tiers is not None:
        problems.extend(_tier_problems(cfg, (*at, "tiers"), tiers))
    if algo.architectures == "searched" and not isinstance(before, FedorASSearchConfig):
        problems.append(((*at, "architectures"), "'searched' must follow a 'fedoras_search' phase"))
    if algo.architectures == "given":
        count = len(tiers.shares) if tiers is not None else _inherited_tiers(cfg, at)
        if len(algo.paths) != count:
            problems.append(((*at, "paths"), f"must list one path per tier ({count}), got {len(algo.paths)}"))
        if isinstance(cfg.model, SupernetConfig) and cfg.model.blocks_per_stage:
            for i, path in enumerate(algo.paths):
                problems.extend(_path_problems(cfg.model, (*at, "paths", i), path))
    elif algo.paths:
        problems.append(((*at, "paths"), "are used only with architectures: given"))
    return problems


def _inherited_tiers(cfg: ExperimentConfig, at: KeyPath) -> int:
    """How many tiers the last fedoras phase before ``at`` makes."""
    for phase in reversed(cfg.phases[: int(at[1])]):
        if isinstance(phase.algorithm, FedorASConfig):
            return len(phase.algorithm.tiers.shares)
    return 0
