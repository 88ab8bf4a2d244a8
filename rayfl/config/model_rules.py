"""Rules of the model sections that span values: the supernet's (paper 003's search space: known ops, whole stages, a
realised path of one known op per searchable block) and the MLP's widths. Imports neither torch nor Ray."""

from __future__ import annotations

from typing import Any

from rayfl.config.model import SUPERNET_OPS, MLPConfig, SupernetConfig
from rayfl.core.errors import KeyPath, Problem

__all__ = ["mlp_problems", "path_problems", "supernet_problems"]


def supernet_problems(model: Any) -> list[Problem]:
    if not isinstance(model, SupernetConfig):
        return []
    problems: list[Problem] = []
    for i, op in enumerate(model.ops):
        if op not in SUPERNET_OPS:
            problems.append((("model", "ops", i), f"unknown op {op!r}; known: {', '.join(SUPERNET_OPS)}"))
    if not model.blocks_per_stage or min(model.blocks_per_stage) < 1:
        problems.append((("model", "blocks_per_stage"), "must list at least one stage of at least one block"))
    elif model.path:
        problems.extend(path_problems(model, ("model", "path"), model.path))
    if model.elastic == "width" and not model.path:
        problems.append((("model", "elastic"), "width needs model.path (the path whose widths shrink)"))
    return problems


def path_problems(model: SupernetConfig, at: KeyPath, path: tuple[str, ...]) -> list[Problem]:
    blocks = sum(model.blocks_per_stage)
    if len(path) != blocks:
        return [(at, f"must name one op per searchable block ({blocks}), got {len(path)}")]
    return [((*at, i), f"op {op!r} is not one of model.ops") for i, op in enumerate(path) if op not in model.ops]


def mlp_problems(model: Any) -> list[Problem]:
    if not isinstance(model, MLPConfig):
        return []
    if not model.hidden:
        return [(("model", "hidden"), "must list at least one hidden width")]
    problems: list[Problem] = [(("model", "hidden", i), f"must be >= 1, got {w}") for i, w in enumerate(model.hidden)
                               if w < 1]  # fmt: skip
    return problems[:1]
