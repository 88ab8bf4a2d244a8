"""A tiny three-phase FedorAS run (supernet training → search → per-tier fine-tuning) for the phase and backend
tests."""

from __future__ import annotations

from rayfl.config.model import SupernetConfig
from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
from rayfl.experiment.schema import ExperimentConfig, PhaseConfig
from rayfl.fl.methods.fedoras.config import (
    FedorASConfig,
    FedorASFinetuneConfig,
    FedorASSearchConfig,
    FedorASTiersConfig,
)

TINY_TIERS = FedorASTiersConfig(bracket_paths=2000)


def fedoras_tiny_config(finetune: FedorASFinetuneConfig | None = None, **backend: object) -> ExperimentConfig:
    return ExperimentConfig(
        name="fedoras-tiny",
        rounds=7,
        clients_per_round=4,
        data=DataConfig(val_fraction=0.2),  # the search's validation set, held out of the given data set
        model=SupernetConfig(stem_channels=4, blocks_per_stage=(2, 1), ops=("conv1", "ds3_e1", "mb3_e2", "identity")),
        train=TrainConfig(lr=0.05, batch_size=5, eval_batch_size=16),
        backend=BackendConfig(**backend),  # type: ignore[arg-type]
        phases=(
            PhaseConfig(name="supernet", rounds=2, algorithm=FedorASConfig(tiers=TINY_TIERS)),
            PhaseConfig(
                name="search",
                rounds=3,
                algorithm=FedorASSearchConfig(population=6, parents=4, val_examples=40, workers=2),
            ),
            PhaseConfig(name="finetune", rounds=2, algorithm=finetune or FedorASFinetuneConfig()),
        ),
    )
