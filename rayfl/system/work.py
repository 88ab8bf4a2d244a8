"""How much local training a client does in a round: samples processed and FLOPs per sample trained.

Kept apart from ``costs.py`` (which builds models) so that algorithms can read it without importing the cost oracle.
"""

from __future__ import annotations

from rayfl.config.sections import TrainConfig

__all__ = ["TRAIN_FLOPS_PER_FORWARD", "samples_per_round"]

TRAIN_FLOPS_PER_FORWARD = 3.0  # forward + backward (about twice the forward) per sample


def samples_per_round(train: TrainConfig, num_examples: int) -> int:
    """Samples a client processes in one round's local training: ``epochs`` passes over its data, capped by
    ``max_steps`` batches, each batch trained ``steps_per_batch`` times."""
    steps_per_epoch = -(-num_examples // train.batch_size)
    total = train.epochs * num_examples
    if train.max_steps:
        full_epochs, extra = divmod(train.max_steps, max(steps_per_epoch, 1))
        if full_epochs < train.epochs:
            total = full_epochs * num_examples + min(extra * train.batch_size, num_examples)
    return total * train.steps_per_batch
