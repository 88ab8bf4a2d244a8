"""Elastic vision transformer for small images (paper 000 setting 5: ViT-tiny on CIFAR-10).

Patch embedding ``Conv2d(in_channels, embed, patch, stride=patch)``, a learned class token and position embedding
(dropout after), pre-LN blocks (``models/elastic/transformer.py``), a final LayerNorm and a linear head on the class
token. Presets (``ViTConfig.size``): ``tiny`` = ViT-Ti of Dosovitskiy et al. / DeiT (embed 192, 12 blocks of 3 heads
of 64, MLP 768); ``tiny_tiny`` = the same with one block ("ViT-tiny with only one depth", paper 000). With 4x4 patches
a 32x32 image gives 64 patches + the class token; ViT-tiny with 10 classes has 5,362,762 parameters.

Searchable dimensions: per block its number of heads (``blocks.i.heads``) and its MLP width (``blocks.i.mlp``), both
skippable; the embedding width is fixed. ``head.weight`` and ``head.bias`` are the classifier (rows = classes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from rayfl.config.model import ViTConfig
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

__all__ = ["VIT_PRESETS", "ElasticViT", "ViTFamily"]

VIT_PRESETS: dict[str, TransformerShape] = {
    "tiny": TransformerShape(embed_dim=192, depth=12, heads=3, head_dim=64, mlp_dim=768),
    "tiny_tiny": TransformerShape(embed_dim=192, depth=1, heads=3, head_dim=64, mlp_dim=768),
}


def _embed(
    x: torch.Tensor, patch_embed: nn.Conv2d, cls_token: torch.Tensor, pos_embed: torch.Tensor, drop: nn.Module
) -> torch.Tensor:
    """Images → (batch, 1 + patches, embed): class token first, then the patches in raster order."""
    patches = patch_embed(x).flatten(2).transpose(1, 2)
    tokens = torch.cat([cls_token.expand(x.shape[0], -1, -1), patches], dim=1)
    out: torch.Tensor = drop(tokens + pos_embed)
    return out


def _classify(h: torch.Tensor, norm: nn.LayerNorm, head: nn.Linear) -> torch.Tensor:
    """Final LayerNorm and the linear head, on the class token only (LayerNorm is per token)."""
    logits: torch.Tensor = head(norm(h[:, 0]))
    return logits


class ElasticViT(nn.Module):
    """The ViT with ``heads[i]`` heads and ``mlps[i]`` MLP units in block ``i`` (0 removes that branch)."""

    def __init__(
        self,
        shape: TransformerShape,
        heads: Sequence[int],
        mlps: Sequence[int],
        in_channels: int,
        num_classes: int,
        image_size: int,
        patch_size: int,
        act: str,
        dropout: float,
    ) -> None:
        super().__init__()
        e = shape.embed_dim
        tokens = (image_size // patch_size) ** 2 + 1
        self.patch_embed = nn.Conv2d(in_channels, e, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, e))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, e))
        self.pos_drop = make_dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(e, h, shape.head_dim, m, act, dropout, causal=False) for h, m in zip(heads, mlps, strict=True)
        )
        self.norm = nn.LayerNorm(e, eps=LN_EPS)
        self.head = nn.Linear(e, num_classes)
        init_transformer(self)
        nn.init.trunc_normal_(self.cls_token, std=0.02, a=-0.04, b=0.04)
        nn.init.trunc_normal_(self.pos_embed, std=0.02, a=-0.04, b=0.04)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _embed(x, self.patch_embed, self.cls_token, self.pos_embed, self.pos_drop)
        for block in self.blocks:
            h = block(h)
        return _classify(h, self.norm, self.head)


class ViTFamily(ElasticFamily):
    """Search space and builder of the elastic ViT (see module docstring).

    The keyword-only arguments override the preset's sizes (small models for tests, custom widths).
    """

    def __init__(
        self,
        cfg: ViTConfig,
        in_channels: int = 3,
        num_classes: int = 10,
        image_size: int = 32,
        *,
        embed_dim: int | None = None,
        depth: int | None = None,
        heads: int | None = None,
        head_dim: int | None = None,
        mlp_dim: int | None = None,
    ) -> None:
        if cfg.patch_size > image_size:
            raise ValueError(f"model.patch_size={cfg.patch_size} is larger than the {image_size}px images")
        self.cfg = cfg
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.image_size = image_size
        self.shape = resolve_shape(
            VIT_PRESETS[cfg.size], embed_dim=embed_dim, depth=depth, heads=heads, head_dim=head_dim, mlp_dim=mlp_dim
        )
        self.tokens = (image_size // cfg.patch_size) ** 2 + 1
        e, p = self.shape.embed_dim, cfg.patch_size
        dims: list[Dimension] = []
        layouts: dict[str, TensorLayout] = {
            "cls_token": TensorLayout((1, 1, e), (None, None, None)),
            "pos_embed": TensorLayout((1, self.tokens, e), (None, None, None)),
            "patch_embed.weight": TensorLayout((e, in_channels, p, p), (None, None, None, None)),
            "patch_embed.bias": TensorLayout((e,), (None,)),
        }
        self.block_dims = add_block_layouts(self.shape, dims, layouts)
        layouts["norm.weight"] = TensorLayout((e,), (None,))
        layouts["norm.bias"] = TensorLayout((e,), (None,))
        layouts["head.weight"] = TensorLayout((num_classes, e), (None, None))
        layouts["head.bias"] = TensorLayout((num_classes,), (None,))
        self.space = SearchSpace(tuple(dims), layouts, classifier=("head.weight", "head.bias"))

    def layer_groups(self) -> tuple[tuple[int, ...], ...]:
        return block_groups(self.block_dims)

    def stage_blocks(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        return (block_groups(self.block_dims),)

    def build(self, units: Sequence[int]) -> nn.Module:
        return ElasticViT(
            self.shape,
            [units[bd.heads] for bd in self.block_dims],
            [units[bd.mlp] for bd in self.block_dims],
            self.in_channels,
            self.num_classes,
            self.image_size,
            self.cfg.patch_size,
            self.cfg.act,
            self.cfg.dropout,
        )

    def cost_units(self) -> list[CostUnit]:
        cfg, e, res, c = self.cfg, self.shape.embed_dim, self.image_size, self.in_channels

        def embed(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
            return _EmbedPiece(c, e, res, cfg.patch_size, cfg.dropout), _images(c, res)

        def head(w: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
            return _HeadPiece(e, self.num_classes), hidden_states(self.tokens, e)

        return [
            CostUnit(("vit_embed", c, res, cfg.patch_size, e, cfg.dropout), (), None, embed),
            *block_cost_units(self.shape, self.block_dims, self.tokens, cfg.act, cfg.dropout, causal=False),
            CostUnit(("vit_head", e, self.tokens, self.num_classes), (), None, head),
        ]


class _EmbedPiece(nn.Module):
    """Patch embedding, class token and position embedding alone, for the cost model."""

    def __init__(self, in_channels: int, embed_dim: int, image_size: int, patch_size: int, dropout: float) -> None:
        super().__init__()
        tokens = (image_size // patch_size) ** 2 + 1
        self.patch_embed = nn.Conv2d(in_channels, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, embed_dim))
        self.pos_drop = make_dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _embed(x, self.patch_embed, self.cls_token, self.pos_embed, self.pos_drop)


class _HeadPiece(nn.Module):
    """Final LayerNorm and classifier alone, for the cost model."""

    def __init__(self, embed_dim: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(embed_dim, eps=LN_EPS)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return _classify(h, self.norm, self.head)


def _images(channels: int, res: int) -> Callable[[int, torch.device], torch.Tensor]:
    def make(batch: int, device: torch.device) -> torch.Tensor:
        return torch.randn(batch, channels, res, res, device=device)

    return make
