"""The messages' model architectures, typed structurally in core and read back as model sections by the layers above,
and client outcomes built by keyword only."""

from __future__ import annotations

import pytest

from rayfl.config.model import MODEL_CONFIGS, CNNConfig, as_model_config, as_model_configs
from rayfl.core.messages import Assignment, ClientOutcome, ServerState, TrainTask


def test_every_model_section_is_read_back_as_itself_and_anything_else_is_refused() -> None:
    sections = [cls() for cls in MODEL_CONFIGS.values()]
    assert all(as_model_config(s) is s for s in sections)
    state = ServerState(params={}, models=tuple(sections))
    assert as_model_configs(state.models) == tuple(sections)
    task = TrainTask(client_id=0, round_idx=0, seed=0, lr=0.1, assignment=Assignment(), model_config=CNNConfig())
    assert task.model_config is not None and as_model_config(task.model_config) == CNNConfig()
    with pytest.raises(TypeError, match="must be a model section, got dict"):
        as_model_config({"name": "cnn"})  # type: ignore[arg-type]


def test_a_client_outcome_is_built_by_keyword_only() -> None:
    """Twelve fields, several of them ints or floats side by side: a positional outcome is refused."""
    with pytest.raises(TypeError):
        ClientOutcome(1, 10, 0.5, 2, 100, 50)  # type: ignore[call-arg]
    outcome = ClientOutcome(client_id=1, num_examples=10, train_loss=0.5, num_steps=2, bytes_down=100, bytes_up=50)
    assert (outcome.bytes_down, outcome.bytes_up, outcome.failure, outcome.model_id) == (100, 50, None, 0)
