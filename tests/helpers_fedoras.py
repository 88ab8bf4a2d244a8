"""A tiny three-phase FedorAS run (supernet → search → supernet again) for the phase and backend tests."""

from __future__ import annotations

from rayfl.config import (
    BackendConfig,
    ExperimentConfig,
    FedorASConfig,
    FedorASSearchConfig,
    PhaseConfig,
    SupernetConfig,
    TrainConfig,
)


def fedoras_tiny_config(**backend: object) -> ExperimentConfig:
    return ExperimentConfig(
        name="fedoras-tiny",
        rounds=6,
        clients_per_round=4,
        model=SupernetConfig(stem_channels=4, blocks_per_stage=(2, 1), ops=("conv1", "ds3_e1", "mb3_e2", "identity")),
        train=TrainConfig(lr=0.05, batch_size=5, eval_batch_size=16),
        backend=BackendConfig(**backend),  # type: ignore[arg-type]
        phases=(
            PhaseConfig(name="supernet", rounds=2, algorithm=FedorASConfig(bracket_paths=2000)),
            PhaseConfig(
                name="search",
                rounds=3,
                algorithm=FedorASSearchConfig(population=6, parents=4, val_examples=40, workers=2),
            ),
            PhaseConfig(name="supernet-again", rounds=1, algorithm=FedorASConfig(bracket_paths=2000)),
        ),
    )
