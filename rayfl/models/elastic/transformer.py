"""Shared pre-LN transformer pieces of the elastic ViT and CharBert families.

A block is ``x = x + Attn(LN1(x)); x = x + MLP(LN2(x))``. Attention has separate ``q``, ``k``, ``v`` projections
(embed → heads x head_dim, with bias) and an output projection ``o`` (heads x head_dim → embed), so a sub-model's
heads take their own rows of Q, K and V (never leading rows of a fused ``qkv``; ALGORITHMS.md section 12, bug 4).

Searchable dimensions, per block ``i``:

* ``blocks.i.heads``: the number of attention heads (``head_dim`` is fixed per model), bound with ``group=head_dim``
  to the rows of ``q``/``k``/``v`` and the columns of ``o``;
* ``blocks.i.mlp``: the hidden width of the MLP (rows of ``fc1``, its bias, columns of ``fc2``).

Both are skippable. 0 heads removes the whole attention branch including ``norm1`` (its tensors are gated on the
heads dimension); 0 MLP units removes the MLP branch including ``norm2``; with both at 0 the block is the identity.
At paper 000's granularity a block is one layer (``block_groups``: its two dimensions share one ratio, so 0 removes
the whole block and 0.5 halves both its heads and its MLP); searching the two separately is the finer space.
The embedding width (the residual stream) is not searchable, which keeps every residual add aligned.

Attention is written out (scores, softmax, weighted sum) rather than calling ``scaled_dot_product_attention``: the
result and the tensors saved for backward are then the same on every device and backend (the cost model measures
pieces on the meta device, where SDPA would take its math path while CUDA takes a fused kernel). LayerNorms use
``eps=1e-6``. Weights: linears and embeddings ``N(0, 0.02)`` truncated at 2 std, biases 0, norms 1/0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from rayfl.models.elastic.family import CostUnit
from rayfl.models.elastic.space import Axis, Dimension, TensorLayout

__all__ = [
    "LN_EPS",
    "Block",
    "BlockDims",
    "Mlp",
    "SelfAttention",
    "TransformerShape",
    "add_block_layouts",
    "block_cost_units",
    "block_groups",
    "hidden_states",
    "init_transformer",
    "make_act",
    "make_dropout",
    "resolve_shape",
]

LN_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class TransformerShape:
    """Full (global) sizes: residual width, number of blocks, heads per block, width of a head, MLP hidden width."""

    embed_dim: int
    depth: int
    heads: int
    head_dim: int
    mlp_dim: int

    def __post_init__(self) -> None:
        for name in ("embed_dim", "depth", "heads", "head_dim", "mlp_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"transformer {name} must be at least 1, got {getattr(self, name)}")


def resolve_shape(preset: TransformerShape, **overrides: int | None) -> TransformerShape:
    """``preset`` with every override that is not ``None`` applied (for small test models or custom sizes)."""
    return replace(preset, **{k: v for k, v in overrides.items() if v is not None})


@dataclass(frozen=True, slots=True)
class BlockDims:
    """Indices (into the search space) of one block's two dimensions."""

    heads: int
    mlp: int


def make_act(name: str) -> nn.Module:
    if name == "relu6":
        return nn.ReLU6(inplace=False)
    if name == "gelu":
        return nn.GELU()
    raise ValueError(f"unknown transformer activation {name!r} (gelu or relu6)")


def make_dropout(p: float) -> nn.Module:
    """``Dropout(p)``, or the identity at ``p == 0`` (a zero-rate dropout still saves a mask for backward)."""
    return nn.Dropout(p) if p > 0.0 else nn.Identity()


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate Q, K, V projections; ``causal`` masks future positions."""

    def __init__(self, embed_dim: int, heads: int, head_dim: int, dropout: float, causal: bool) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        self.causal = causal
        inner = heads * head_dim
        self.q = nn.Linear(embed_dim, inner)
        self.k = nn.Linear(embed_dim, inner)
        self.v = nn.Linear(embed_dim, inner)
        self.o = nn.Linear(inner, embed_dim)
        self.attn_drop = make_dropout(dropout)
        self.proj_drop = make_dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:  # (b, t, h*d) → (b, h, t, d)
            return y.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        q = split(self.q(x)) * self.head_dim**-0.5
        k, v = split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-2, -1)
        if self.causal:
            mask = torch.full((t, t), float("-inf"), device=x.device, dtype=scores.dtype).triu(1)
            scores = scores + mask
        attn = self.attn_drop(scores.softmax(dim=-1))
        out = (attn @ v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        result: torch.Tensor = self.proj_drop(self.o(out))
        return result


class Mlp(nn.Module):
    """``fc1 → act → dropout → fc2 → dropout``."""

    def __init__(self, embed_dim: int, hidden: int, act: str, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden)
        self.act = make_act(act)
        self.drop1 = make_dropout(dropout)
        self.fc2 = nn.Linear(hidden, embed_dim)
        self.drop2 = make_dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))
        return out


class Block(nn.Module):
    """Pre-LN block with ``heads`` heads and ``mlp_dim`` MLP units; a branch with 0 units has no modules at all."""

    norm1: nn.LayerNorm | None
    attn: SelfAttention | None
    norm2: nn.LayerNorm | None
    mlp: Mlp | None

    def __init__(
        self, embed_dim: int, heads: int, head_dim: int, mlp_dim: int, act: str, dropout: float, causal: bool
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim, eps=LN_EPS) if heads > 0 else None
        self.attn = SelfAttention(embed_dim, heads, head_dim, dropout, causal) if heads > 0 else None
        self.norm2 = nn.LayerNorm(embed_dim, eps=LN_EPS) if mlp_dim > 0 else None
        self.mlp = Mlp(embed_dim, mlp_dim, act, dropout) if mlp_dim > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.attn is not None and self.norm1 is not None:
            x = x + self.attn(self.norm1(x))
        if self.mlp is not None and self.norm2 is not None:
            x = x + self.mlp(self.norm2(x))
        return x


def init_transformer(model: nn.Module) -> None:
    """Linear and embedding weights ``N(0, 0.02)`` truncated at ±2 std, linear biases 0, LayerNorm 1/0."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(m.weight, std=0.02, a=-0.04, b=0.04)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def add_block_layouts(
    shape: TransformerShape, dims: list[Dimension], layouts: dict[str, TensorLayout], prefix: str = "blocks"
) -> tuple[BlockDims, ...]:
    """Append each block's two dimensions to ``dims`` and its tensor layouts (in ``state_dict`` order) to
    ``layouts``; returns the dimension indices per block."""
    e, d, h, m = shape.embed_dim, shape.head_dim, shape.heads, shape.mlp_dim
    out: list[BlockDims] = []
    for i in range(shape.depth):
        p = f"{prefix}.{i}."
        dims.append(Dimension(f"{prefix}.{i}.heads", h, skippable=True))
        hd = len(dims) - 1
        dims.append(Dimension(f"{prefix}.{i}.mlp", m, skippable=True))
        md = len(dims) - 1
        heads, units = Axis(hd, group=d), Axis(md)
        entries: list[tuple[str, tuple[int, ...], tuple[Axis | None, ...], int]] = [
            ("norm1.weight", (e,), (None,), hd),
            ("norm1.bias", (e,), (None,), hd),
        ]
        for proj in ("q", "k", "v"):
            entries.append((f"attn.{proj}.weight", (h * d, e), (heads, None), hd))
            entries.append((f"attn.{proj}.bias", (h * d,), (heads,), hd))
        entries += [
            ("attn.o.weight", (e, h * d), (None, heads), hd),
            ("attn.o.bias", (e,), (None,), hd),
            ("norm2.weight", (e,), (None,), md),
            ("norm2.bias", (e,), (None,), md),
            ("mlp.fc1.weight", (m, e), (units, None), md),
            ("mlp.fc1.bias", (m,), (units,), md),
            ("mlp.fc2.weight", (e, m), (None, units), md),
            ("mlp.fc2.bias", (e,), (None,), md),
        ]
        for name, size, axes, gate in entries:
            layouts[p + name] = TensorLayout(size, axes, gate)
        out.append(BlockDims(hd, md))
    return tuple(out)


def block_groups(block_dims: Sequence[BlockDims]) -> tuple[tuple[int, ...], ...]:
    """Each block's dimensions as one layer of paper 000's search space: ``(heads, mlp)`` per block, heads first
    (0 heads with 0 MLP units removes the block)."""
    return tuple((bd.heads, bd.mlp) for bd in block_dims)


def hidden_states(tokens: int, embed_dim: int) -> Callable[[int, torch.device], torch.Tensor]:
    """Input maker of a piece that reads the residual stream: ``(batch, tokens, embed)`` floats with grad."""

    def make(batch: int, device: torch.device) -> torch.Tensor:
        return torch.randn(batch, tokens, embed_dim, device=device, requires_grad=True)

    return make


def block_cost_units(
    shape: TransformerShape,
    block_dims: Sequence[BlockDims],
    tokens: int,
    act: str,
    dropout: float,
    causal: bool,
) -> list[CostUnit]:
    """Per block an attention piece (LN1 + attention + residual add) and an MLP piece (LN2 + MLP + residual add).

    Each piece is a ``Block`` with the other branch skipped, so it is exactly that half of the model's block; its
    output is a residual add (nothing saved), and it saves its input (LayerNorm), which no earlier piece saves.
    """
    e, d = shape.embed_dim, shape.head_dim
    attn_key = ("transformer_attn", e, d, tokens, causal, dropout)
    mlp_key = ("transformer_mlp", e, tokens, act, dropout)

    def attn(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
        return Block(e, w[0], d, 0, act, dropout, causal), hidden_states(tokens, e)

    def mlp(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
        return Block(e, 0, d, w[0], act, dropout, causal), hidden_states(tokens, e)

    units: list[CostUnit] = []
    for bd in block_dims:
        units.append(CostUnit(attn_key, (bd.heads,), bd.heads, attn))
        units.append(CostUnit(mlp_key, (bd.mlp,), bd.mlp, mlp))
    return units
