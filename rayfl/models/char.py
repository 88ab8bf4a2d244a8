"""Next-character models for Shakespeare: LEAF's LSTM and a small causal transformer.

Both read a window of ``seq_len`` character indices and return logits for the character that follows it.
"""

from __future__ import annotations

import torch
from torch import nn

from rayfl.config.model import CharLSTMConfig, CharTransformerConfig

__all__ = ["CharLSTM", "CharTransformer"]


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model (Caldas et al., 2018): embedding 8, two LSTM layers of 256, linear read-out."""

    def __init__(self, cfg: CharLSTMConfig, vocab_size: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, cfg.embed_dim)
        self.lstm = nn.LSTM(cfg.embed_dim, cfg.hidden_dim, num_layers=cfg.num_layers, batch_first=True)
        self.head = nn.Linear(cfg.hidden_dim, vocab_size)

    def forward(self, x: torch.Tensor, all_positions: bool = False) -> torch.Tensor:
        """Logits for the next character: ``[B, V]`` after the window, or ``[B, L, V]`` after every prefix."""
        out, _ = self.lstm(self.embed(x))
        logits: torch.Tensor = self.head(out if all_positions else out[:, -1])
        return logits


class _Block(nn.Module):
    """Pre-norm transformer block with causal self-attention."""

    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        a = self.norm1(h)
        h = h + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
        out: torch.Tensor = h + self.mlp(self.norm2(h))
        return out


class CharTransformer(nn.Module):
    """A small causal transformer; the last position's output predicts the next character."""

    def __init__(self, cfg: CharTransformerConfig, vocab_size: int, seq_len: int) -> None:
        super().__init__()
        if cfg.dim % cfg.heads:
            raise ValueError(f"model.dim ({cfg.dim}) must be divisible by model.heads ({cfg.heads})")
        self.embed = nn.Embedding(vocab_size, cfg.dim)
        self.pos = nn.Parameter(torch.randn(seq_len, cfg.dim) * 0.02)
        mlp_dim = max(1, round(cfg.dim * cfg.mlp_ratio))
        self.blocks = nn.ModuleList(_Block(cfg.dim, cfg.heads, mlp_dim) for _ in range(cfg.num_layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, vocab_size)
        self.causal_mask: torch.Tensor
        self.register_buffer(
            "causal_mask", torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), 1), persistent=False
        )

    def forward(self, x: torch.Tensor, all_positions: bool = False) -> torch.Tensor:
        """Logits for the next character: ``[B, V]`` after the window, or ``[B, L, V]`` after every prefix."""
        length = x.shape[1]
        h = self.embed(x) + self.pos[:length]
        mask = self.causal_mask[:length, :length]
        for block in self.blocks:
            h = block(h, mask)
        logits: torch.Tensor = self.head(self.norm(h if all_positions else h[:, -1]))
        return logits
