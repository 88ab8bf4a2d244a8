"""The configuration sections of FedResCuE and its ablations FedSeq and FedRush (paper 004). Imports neither torch nor
Ray: the registry and ``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded, width_ratios
from rayfl.fl.common.widths import CAPACITIES, COLUMN_RATIOS

__all__ = ["FedResCuEConfig", "FedRushConfig", "FedSeqConfig"]


@dataclass(frozen=True, kw_only=True)
class FedResCuEConfig:
    """FedResCuE (Zhu et al., ICML 2022, paper 004): each client the largest capacity of ``capacities`` that fits its
    budgets (nested first-k widths, the same ratio on every layer); per batch, progressive self-distillation over
    ``num_ratios`` (S) ordered ratios of ``ratios`` (P, relative to the client's capacity, ending at 1), each step
    cross-entropy + ``alpha`` x KL(teacher || sub-model) updating only the columns that ratio adds (``freeze``), then
    one cross-entropy step on the client's model; band-wise plain mean of the uploaded columns (Eq. 4).
    The paper's P is 0.1 to 1 in steps of 0.05."""

    name: Literal["fedrescue"] = "fedrescue"
    capacities: tuple[float, ...] = CAPACITIES
    ratios: tuple[float, ...] = width_ratios(COLUMN_RATIOS, zero_ok=True)
    num_ratios: int = bounded(4, ge=1)
    alpha: float = bounded(1.0, ge=0.0)
    freeze: bool = True


@dataclass(frozen=True, kw_only=True)
class FedSeqConfig(FedResCuEConfig):
    """FedSeq (paper 004's ablation): FedResCuE without the distillation term (alpha = 0, no teacher pass)."""

    name: Literal["fedseq"] = "fedseq"  # type: ignore[assignment]
    alpha: float = bounded(0.0, ge=0.0, le=0.0)


@dataclass(frozen=True, kw_only=True)
class FedRushConfig(FedResCuEConfig):
    """FedRush (paper 004's baseline): FedResCuE's sampled ratios and distillation, every step updating the whole
    sub-model (no freezing of earlier columns)."""

    name: Literal["fedrush"] = "fedrush"  # type: ignore[assignment]
    freeze: bool = False
