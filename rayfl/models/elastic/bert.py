"""Elastic BERT-style character model predicting the next character (paper 000 setting 6).

Character embedding (vocab x hidden) plus a learned position embedding (seq_len x hidden), pre-LN blocks with causal
self-attention (``models/elastic/transformer.py``), a final LayerNorm and a decoder ``Linear(hidden, vocab)``. The
output convention is ``models/char.py``'s ``CharTransformer``: ``model(x)`` gives the logits of the character after
the window ``(batch, vocab)``; ``model(x, all_positions=True)`` those after every prefix ``(batch, seq_len, vocab)``
(``train.sequence_loss=all`` in ``Algorithm.local_loss``). ``CharBertConfig.all_positions`` tells the cost model
which of the two training runs: with it, the decoder piece computes logits at every position.

Sizes (``CharBertConfig.size``; head_dim 64 everywhere): ``tiny`` = 6 layers, hidden 256, 6 heads, FFN 1024 (paper
000: "BERT-tiny only has 6 layers, hidden dimension 256 and attention head 6"); ``mini`` 4/256/4/1024; ``small``
4/512/8/2048; ``medium`` 8/512/8/2048; ``base`` 12/768/12/3072; ``large`` 24/1024/16/4096 (Devlin et al.). The head
width is fixed at 64 and not tied to hidden / heads: 256 is not divisible by 6, so in ``tiny`` Q, K and V map
256 → 6 x 64 = 384 and the output projection maps 384 → 256.

The model is built from our own modules, not HuggingFace ``transformers`` (not a dependency, and its ``BertLayer``
ties the head count to the hidden size, so per-layer head counts would fight it).

Searchable dimensions: per block its number of heads (``blocks.i.heads``) and FFN width (``blocks.i.mlp``), both
skippable; the hidden width is fixed. ``decoder.weight`` and ``decoder.bias`` are the classifier (rows = vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from rayfl.config.model import CharBertConfig
from rayfl.models.elastic.family import CostUnit, ElasticFamily
from rayfl.models.elastic.space import Dimension, SearchSpace, TensorLayout
from rayfl.models.elastic.transformer import (
    LN_EPS,
    Block,
    TransformerShape,
    add_block_layouts,
    block_cost_units,
    block_groups,
    hidden_states,
    init_transformer,
    make_dropout,
    resolve_shape,
)

__all__ = ["BERT_PRESETS", "CharBertFamily", "ElasticCharBert"]

BERT_PRESETS: dict[str, TransformerShape] = {
    "tiny": TransformerShape(embed_dim=256, depth=6, heads=6, head_dim=64, mlp_dim=1024),
    "mini": TransformerShape(embed_dim=256, depth=4, heads=4, head_dim=64, mlp_dim=1024),
    "small": TransformerShape(embed_dim=512, depth=4, heads=8, head_dim=64, mlp_dim=2048),
    "medium": TransformerShape(embed_dim=512, depth=8, heads=8, head_dim=64, mlp_dim=2048),
    "base": TransformerShape(embed_dim=768, depth=12, heads=12, head_dim=64, mlp_dim=3072),
    "large": TransformerShape(embed_dim=1024, depth=24, heads=16, head_dim=64, mlp_dim=4096),
}


def _embed(x: torch.Tensor, tok_embed: nn.Embedding, pos_embed: torch.Tensor, drop: nn.Module) -> torch.Tensor:
    """Character indices (batch, length) → (batch, length, hidden)."""
    out: torch.Tensor = drop(tok_embed(x) + pos_embed[: x.shape[1]])
    return out


def _decode(h: torch.Tensor, norm: nn.LayerNorm, decoder: nn.Linear, all_positions: bool) -> torch.Tensor:
    """Final LayerNorm and decoder at every position, or at the last one only."""
    logits: torch.Tensor = decoder(norm(h if all_positions else h[:, -1]))
    return logits


class ElasticCharBert(nn.Module):
    """The character model with ``heads[i]`` heads and ``mlps[i]`` FFN units in block ``i`` (0 removes the branch)."""

    def __init__(
        self,
        shape: TransformerShape,
        heads: Sequence[int],
        mlps: Sequence[int],
        vocab_size: int,
        seq_len: int,
        act: str,
        dropout: float,
    ) -> None:
        super().__init__()
        e = shape.embed_dim
        self.tok_embed = nn.Embedding(vocab_size, e)
        self.pos_embed = nn.Parameter(torch.zeros(seq_len, e))
        self.emb_drop = make_dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(e, h, shape.head_dim, m, act, dropout, causal=True) for h, m in zip(heads, mlps, strict=True)
        )
        self.norm = nn.LayerNorm(e, eps=LN_EPS)
        self.decoder = nn.Linear(e, vocab_size)
        self.embed_dim = e
        self.vocab_size = vocab_size
        init_transformer(self)
        nn.init.trunc_normal_(self.pos_embed, std=0.02, a=-0.04, b=0.04)

    def forward(self, x: torch.Tensor, all_positions: bool = False) -> torch.Tensor:
        """Logits for the next character: ``[B, V]`` after the window, or ``[B, L, V]`` after every prefix."""
        return self.forward_hidden(_embed(x, self.tok_embed, self.pos_embed, self.emb_drop), all_positions)

    def embedding_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The embedding output's statistics over uniformly random tokens, without data: its mean at each position and
        dimension ``[L, embed_dim]`` (the tokens' mean embedding plus the position's) and its standard deviation per
        dimension ``[embed_dim]`` (the token embeddings' own, over the vocabulary; the position adds no spread)."""
        with torch.no_grad():
            tok = self.tok_embed.weight.detach()
            return tok.mean(0) + self.pos_embed.detach(), tok.std(0, unbiased=False)

    def forward_hidden(self, h: torch.Tensor, all_positions: bool = False) -> torch.Tensor:
        """The model from the embedding output on: hidden states ``[B, L, embed_dim]`` (token plus position embedding,
        after its dropout) through the blocks, the final norm and the decoder. Server-side in-place distillation
        (``fl/common/distill/server.py``) feeds Gaussian noise here, since characters are discrete."""
        for block in self.blocks:
            h = block(h)
        return _decode(h, self.norm, self.decoder, all_positions)


class CharBertFamily(ElasticFamily):
    """Search space and builder of the elastic character BERT (see module docstring).

    The keyword-only arguments override the preset's sizes (``embed_dim`` = hidden, ``mlp_dim`` = FFN width).
    """

    def __init__(
        self,
        cfg: CharBertConfig,
        vocab_size: int,
        seq_len: int = 80,
        *,
        embed_dim: int | None = None,
        depth: int | None = None,
        heads: int | None = None,
        head_dim: int | None = None,
        mlp_dim: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.shape = resolve_shape(
            BERT_PRESETS[cfg.size], embed_dim=embed_dim, depth=depth, heads=heads, head_dim=head_dim, mlp_dim=mlp_dim
        )
        e = self.shape.embed_dim
        dims: list[Dimension] = []
        layouts: dict[str, TensorLayout] = {
            "pos_embed": TensorLayout((seq_len, e), (None, None)),
            "tok_embed.weight": TensorLayout((vocab_size, e), (None, None)),
        }
        self.block_dims = add_block_layouts(self.shape, dims, layouts)
        layouts["norm.weight"] = TensorLayout((e,), (None,))
        layouts["norm.bias"] = TensorLayout((e,), (None,))
        layouts["decoder.weight"] = TensorLayout((vocab_size, e), (None, None))
        layouts["decoder.bias"] = TensorLayout((vocab_size,), (None,))
        self.space = SearchSpace(tuple(dims), layouts, classifier=("decoder.weight", "decoder.bias"))

    def layer_groups(self) -> tuple[tuple[int, ...], ...]:
        return block_groups(self.block_dims)

    def stage_blocks(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        return (block_groups(self.block_dims),)

    def build(self, units: Sequence[int]) -> nn.Module:
        return ElasticCharBert(
            self.shape,
            [units[bd.heads] for bd in self.block_dims],
            [units[bd.mlp] for bd in self.block_dims],
            self.vocab_size,
            self.seq_len,
            self.cfg.act,
            self.cfg.dropout,
        )

    def cost_units(self) -> list[CostUnit]:
        cfg, e, n, v = self.cfg, self.shape.embed_dim, self.seq_len, self.vocab_size

        def embed(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
            return _EmbedPiece(v, n, e, cfg.dropout), _tokens(v, n)

        def head(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
            return _HeadPiece(e, v, cfg.all_positions), hidden_states(n, e)

        return [
            CostUnit(("char_bert_embed", v, n, e, cfg.dropout), (), None, embed),
            *block_cost_units(self.shape, self.block_dims, n, cfg.act, cfg.dropout, causal=True),
            CostUnit(("char_bert_head", e, n, v, cfg.all_positions), (), None, head),
        ]


class _EmbedPiece(nn.Module):
    """Character and position embeddings alone, for the cost model."""

    def __init__(self, vocab_size: int, seq_len: int, embed_dim: int, dropout: float) -> None:
        super().__init__()
        self.tok_embed = nn.Embedding(vocab_size, embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(seq_len, embed_dim))
        self.emb_drop = make_dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _embed(x, self.tok_embed, self.pos_embed, self.emb_drop)


class _HeadPiece(nn.Module):
    """Final LayerNorm and decoder alone, for the cost model."""

    def __init__(self, embed_dim: int, vocab_size: int, all_positions: bool) -> None:
        super().__init__()
        self.all_positions = all_positions
        self.norm = nn.LayerNorm(embed_dim, eps=LN_EPS)
        self.decoder = nn.Linear(embed_dim, vocab_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return _decode(h, self.norm, self.decoder, self.all_positions)


def _tokens(vocab_size: int, seq_len: int) -> Callable[[int, torch.device], torch.Tensor]:
    def make(batch: int, device: torch.device) -> torch.Tensor:
        return torch.randint(0, vocab_size, (batch, seq_len), device=device)

    return make
