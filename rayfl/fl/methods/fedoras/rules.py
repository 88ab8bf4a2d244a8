"""What ``rayfl validate`` checks about FedorAS runs (paper 003) before anything is built: the supernet and its
realised paths, the tiers, and the order of the three phases (supernet training, search, per-tier fine-tuning).

Imports neither torch nor Ray (the loader calls it on every validate). Each problem is a key path and a reason; the
loader turns them into one-line errors naming the file and line.
"""

from __future__ import annotations

from typing import Any

from rayfl.config.model import SupernetConfig
from rayfl.config.model_rules import path_problems
from rayfl.core.errors import KeyPath, Problem
from rayfl.fl.api.rules import RunView
from rayfl.fl.methods.fedoras.config import (
    FedorASConfig,
    FedorASFinetuneConfig,
    FedorASSearchConfig,
    FedorASTiersConfig,
)

__all__ = ["problems"]



def problems(run: RunView, at: KeyPath, algo: Any) -> list[Problem]:
    """A FedorAS phase runs on the whole supernet, in order, with valid tiers and paths."""
    problems: list[Problem] = []
    if not isinstance(run.model, SupernetConfig):
        problems.append(((*at, "name"), f"{algo.name!r} needs model.name: supernet, got {run.model.name!r}"))
    elif run.model.path:
        problems.append((("model", "path"), f"{algo.name!r} works on the whole supernet: leave model.path empty"))
    elif run.model.elastic != "ops":
        problems.append((("model", "elastic"), f"{algo.name!r} searches ops: model.elastic must be ops"))
    before = _previous(run, at)
    if isinstance(algo, FedorASConfig):
        problems.extend(_tier_problems(run, (*at, "tiers"), algo.tiers))
    elif isinstance(algo, FedorASSearchConfig):
        problems.extend(_search_problems(run, at, algo, before))
    elif isinstance(algo, FedorASFinetuneConfig):
        problems.extend(_finetune_problems(run, at, algo, before))
        if algo.draw and algo.architectures != "random":
            problems.append(((*at, "draw"), "a draw of random paths needs architectures: random"))
    return problems


def _previous(run: RunView, at: KeyPath) -> Any:
    """The algorithm of the phase before the section at ``at`` (None for a run's first or only algorithm)."""
    if at[0] != "phases" or int(at[1]) == 0:
        return None
    return run.phases[int(at[1]) - 1].algorithm






def _tier_problems(cfg: RunView, at: KeyPath, tiers: FedorASTiersConfig) -> list[Problem]:
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


def _search_problems(cfg: RunView, at: KeyPath, algo: FedorASSearchConfig, before: Any) -> list[Problem]:
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


def _finetune_problems(cfg: RunView, at: KeyPath, algo: FedorASFinetuneConfig, before: Any) -> list[Problem]:
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
        if count is not None and len(algo.paths) != count:
            problems.append(((*at, "paths"), f"must list one path per tier ({count}), got {len(algo.paths)}"))
        if isinstance(cfg.model, SupernetConfig) and cfg.model.blocks_per_stage:
            for i, path in enumerate(algo.paths):
                problems.extend(path_problems(cfg.model, (*at, "paths", i), path))
    elif algo.paths:
        problems.append(((*at, "paths"), "are used only with architectures: given"))
    return problems


def _inherited_tiers(cfg: RunView, at: KeyPath) -> int | None:
    """How many tiers the last fedoras phase before ``at`` makes; None outside phases (a run of one section has no
    phase before it: its missing ``tiers`` is reported on its own)."""
    if len(at) < 2:
        return None
    for phase in reversed(cfg.phases[: int(at[1])]):
        if isinstance(phase.algorithm, FedorASConfig):
            return len(phase.algorithm.tiers.shares)
    return 0
