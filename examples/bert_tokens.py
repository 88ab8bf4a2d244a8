"""A HuggingFace ``transformers`` BERT, built from a ``BertConfig``, classifying token sequences.

Needs the optional extra: ``pip install 'rayfl[hf]'``. ``examples/bert_tokens.yaml`` names
``examples.bert_tokens:tiny_bert`` as the model factory and ``examples.bert_tokens:federated_tokens`` as the data
factory, which builds a ``FederatedDataset`` with its own (natural) clients.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rayfl.data import FederatedDataset, from_client_arrays


class BertClassifier(nn.Module):
    """``BertForSequenceClassification`` whose forward returns the logits tensor rayfl trains on."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.bert(input_ids=tokens).logits
        return logits


def tiny_bert(num_classes: int, input_shape: tuple[int, ...], vocab_size: int = 32, hidden_size: int = 32) -> nn.Module:
    """A two-layer BERT sized for tests; ``input_shape`` is ``(sequence length,)``."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=max(16, input_shape[0]),
        num_labels=num_classes,
    )
    return BertClassifier(BertForSequenceClassification(config))


def federated_tokens(
    seed: int, num_clients: int, per_client: int = 16, seq_len: int = 12, vocab_size: int = 32
) -> FederatedDataset:
    """Random token sequences labelled by whether token 1 occurs more often than token 2; one client per block."""
    rng = np.random.default_rng(seed)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.integers(0, vocab_size, size=(n, seq_len), dtype=np.int64)
        y = ((x == 1).sum(axis=1) > (x == 2).sum(axis=1)).astype(np.int64)
        return x, y

    train = [sample(per_client) for _ in range(num_clients)]
    x_test, y_test = sample(4 * per_client)
    return from_client_arrays("bert_tokens", "tokens", 2, train, x_test, y_test)
