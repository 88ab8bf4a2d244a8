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
    seed: int,
    num_clients: int,
    per_client: int = 128,
    seq_len: int = 12,
    vocab_size: int = 32,
    num_test: int = 512,
    num_classes: int = 4,
) -> FederatedDataset:
    """Random token sequences, each holding one keyword token; the label is which keyword. One client per block.

    Tokens ``1 .. num_classes`` are the keywords; every other position holds a filler token drawn from
    ``num_classes + 1 .. vocab_size - 1``. The labels are uniform, so the most-frequent-label baseline is about
    ``1 / num_classes``, and a model must find the keyword wherever it sits (attention) to beat it.
    """
    if not 2 <= num_classes <= vocab_size - 2:
        raise ValueError(f"data.kwargs.num_classes must be in 2..{vocab_size - 2}, got {num_classes}")
    rng = np.random.default_rng(seed)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.integers(num_classes + 1, vocab_size, size=(n, seq_len), dtype=np.int64)
        y = rng.integers(0, num_classes, size=n, dtype=np.int64)
        x[np.arange(n), rng.integers(0, seq_len, size=n)] = y + 1
        return x, y

    train = [sample(per_client) for _ in range(num_clients)]
    x_test, y_test = sample(num_test)
    return from_client_arrays("bert_tokens", "tokens", num_classes, train, x_test, y_test)
