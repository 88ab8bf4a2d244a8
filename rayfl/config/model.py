"""Model sections of the schema: one frozen dataclass per architecture, tagged by ``model.name``
(``MODEL_CONFIGS``). Importing this module imports neither torch nor Ray."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rayfl.config.fields import bounded

if TYPE_CHECKING:  # an annotation only: core's message types import torch
    from rayfl.core.messages import ModelArchitecture

__all__ = [
    "MODEL_CONFIGS",
    "SUPERNET_OPS",
    "CNNConfig",
    "CellNetConfig",
    "CharBertConfig",
    "CharLSTMConfig",
    "CharTransformerConfig",
    "CustomModelConfig",
    "EnsembleConfig",
    "FemnistCNNConfig",
    "MLPConfig",
    "ModelConfig",
    "ResNetConfig",
    "SupernetConfig",
    "ViTConfig",
    "as_model_config",
    "as_model_configs",
]


# ---------------------------------------------------------------------------------------------------- models
@dataclass(frozen=True, kw_only=True)
class CharLSTMConfig:
    """LEAF's next-character model: embedding, stacked LSTM, linear read-out of the last step."""

    name: Literal["char_lstm"] = "char_lstm"
    embed_dim: int = bounded(8, ge=1)
    hidden_dim: int = bounded(256, ge=1)
    num_layers: int = bounded(2, ge=1)


@dataclass(frozen=True, kw_only=True)
class CharTransformerConfig:
    """A small causal transformer over characters that predicts the character after the window."""

    name: Literal["char_transformer"] = "char_transformer"
    dim: int = bounded(128, ge=8)
    heads: int = bounded(4, ge=1)
    num_layers: int = bounded(2, ge=1)
    mlp_ratio: float = bounded(4.0, gt=0.0)


@dataclass(frozen=True, kw_only=True)
class CNNConfig:
    """HeteroFL's conv net: blocks of conv → norm → ReLU → max-pool, global pooling, linear classifier."""

    name: Literal["cnn"] = "cnn"
    channels: tuple[int, ...] = (64, 128, 256, 512)
    norm: Literal["batch", "group", "none"] = "none"


@dataclass(frozen=True, kw_only=True)
class ResNetConfig:
    """Pre-activation ResNet for 32x32 images as in HeteroFL (stage widths 64-128-256-512, 3x3 stem, no max-pool).

    ``norm``: ``bn`` = HeteroFL's static BN (batch statistics in training, never tracked on clients), ``gn`` =
    GroupNorm (FedHeN: paper 001's pre-activation ResNet-18 with GroupNorm), ``none``. ``scaler``: HeteroFL's
    divide-by-width-rate before every norm. ``act``: ``relu6``
    bounds activations so that skipping blocks cannot blow them up (paper 000, Sec. 3.4).
    """

    name: Literal["resnet"] = "resnet"
    depth: Literal[18, 34, 50, 101, 152] = 18
    widths: tuple[int, ...] = (64, 128, 256, 512)
    norm: Literal["bn", "gn", "none"] = "bn"
    gn_groups: int = bounded(2, ge=1)
    act: Literal["relu", "relu6"] = "relu"
    scaler: bool = True
    # FedHeN's early exit: a side head (mixed max/avg pooling to side_pool x side_pool, then a linear layer) after
    # stage ``side_exit`` (1-based; 0 = none); "stages 1..side_exit + side head" is the simple model (paper 001)
    side_exit: int = bounded(0, ge=0)
    side_pool: int = bounded(4, ge=1)
    # the main head's pooling: 1 (the default) is the global average pool; k > 1 averages the last stage's maps over
    # k x k equal windows and the linear layer reads all k*k cells (the position of a feature survives, as in the side
    # head; FedHeN's CPU settings, whose synthetic labels depend on where things are)
    head_pool: int = bounded(1, ge=1)
    # the model is its side-exit sub-model alone (stages 1..side_exit + side head, no deep stages): the simple model
    # as a stand-alone architecture with the same tensor names (FedHeN's Decouple baseline trains it as its own model)
    exit_only: bool = False


@dataclass(frozen=True, kw_only=True)
class ViTConfig:
    """Vision transformer for 32x32 images: ``tiny`` (paper 000 setting 5: 4x4 patches, width 192, 12 blocks of 3
    heads) or ``tiny_tiny`` (the same with one block); explicit fields override the preset."""

    name: Literal["vit"] = "vit"
    size: Literal["tiny", "tiny_tiny"] = "tiny"
    patch_size: int = bounded(4, ge=1)
    # 0 keeps the preset's value; a positive value overrides it (CPU-sized variants of the paper's models)
    embed_dim: int = bounded(0, ge=0)
    depth: int = bounded(0, ge=0)
    heads: int = bounded(0, ge=0)
    head_dim: int = bounded(0, ge=0)
    mlp_dim: int = bounded(0, ge=0)
    act: Literal["gelu", "relu6"] = "gelu"
    dropout: float = bounded(0.0, ge=0.0, lt=1.0)


@dataclass(frozen=True, kw_only=True)
class CharBertConfig:
    """BERT-style character encoder predicting the next character (paper 000 setting 6), sizes ``tiny`` (6 layers,
    hidden 256) to ``large`` (24 layers, hidden 1024); per-layer FFN width and heads are searchable."""

    name: Literal["char_bert"] = "char_bert"
    size: Literal["tiny", "mini", "small", "medium", "base", "large"] = "tiny"
    # 0 keeps the preset's value; a positive value overrides it (CPU-sized variants of the paper's models)
    embed_dim: int = bounded(0, ge=0)
    depth: int = bounded(0, ge=0)
    heads: int = bounded(0, ge=0)
    head_dim: int = bounded(0, ge=0)
    mlp_dim: int = bounded(0, ge=0)
    act: Literal["gelu", "relu6"] = "gelu"
    dropout: float = bounded(0.0, ge=0.0, lt=1.0)
    all_positions: bool = True  # predict the next character at every position (train.sequence_loss=all uses it)


@dataclass(frozen=True, kw_only=True)
class FemnistCNNConfig:
    """The LEAF FEMNIST CNN: conv5x5(32) → pool → conv5x5(64) → pool → dense 2048 → classes, for 28x28 images."""

    name: Literal["femnist_cnn"] = "femnist_cnn"
    channels: tuple[int, int] = (32, 64)
    hidden: int = bounded(2048, ge=1)


@dataclass(frozen=True, kw_only=True)
class MLPConfig:
    """A multilayer perceptron for feature vectors (a table's numeric columns; images are flattened), elastic in
    every hidden width. The default is McMahan et al.'s 2NN (AISTATS 2017: two hidden layers of 200 units, ReLU).

    ``hidden``: the hidden widths, each layer linear → scaler → norm, with act → dropout before the next linear.
    ``residual``: ``hidden[0]`` is then the width of a residual stream (the first layer's output) and every later entry
    a block ``x + fc2(dropout(act(fc1(norm(x)))))`` of that inner width, which a sub-model may narrow or remove (ratio
    0: what model search's skipped layers need); without it no layer can be removed. ``norm``: ``batch`` =
    HeteroFL's static BN (batch statistics, never tracked on clients), ``layer`` = LayerNorm, ``none``. ``scaler``:
    HeteroFL's divide-by-width-rate after every hidden linear (training only)."""

    name: Literal["mlp"] = "mlp"
    hidden: tuple[int, ...] = (200, 200)  # hidden widths (residual: the stream's, then each block's inner width)
    act: Literal["relu", "relu6", "gelu"] = "relu"  # relu6 bounds activations where blocks are removed
    norm: Literal["none", "batch", "layer"] = "none"  # after every hidden linear (residual: before every block)
    dropout: float = bounded(0.0, ge=0.0, lt=1.0)  # after every activation
    scaler: bool = True  # HeteroFL's divide-by-width-rate after every hidden linear, in training
    residual: bool = False  # residual blocks after the first layer, which sub-models may remove


SUPERNET_OPS = ("conv1", "ds3_e0.5", "ds3_e1", "ds3_e2", "mb1_e2", "mb3_e0.5", "mb3_e1", "mb3_e2", "identity")


@dataclass(frozen=True, kw_only=True)
class SupernetConfig:
    """FedorAS's supernet (paper 003 Sec. 3, official ``resnet_model.py``): a 3x3 stem of ``stem_channels``, then per
    stage ``blocks_per_stage`` searchable blocks, each a choice among ``ops`` (``conv1``: standard 1x1 conv;
    ``ds3_eE``: depthwise-separable 3x3 with expansion E; ``mbK_eE``: MBConv with kernel K and expansion E;
    ``identity``: the block is skipped, so depth is searchable), and a strided reduction between stages that
    multiplies the channels by ``width_mult``; global pooling and a linear classifier. The paper's CIFAR-10 space is
    ``stem_channels: 64``, ``blocks_per_stage: [4, 4, 4, 4]`` and all nine ops. ``mbconv``: ``official`` (the official
    code's MBConv: a full KxK convolution from c to E x c, Squeeze-and-Excitation, a pointwise back to c) or
    ``separable`` (a pointwise to E x c, then a depthwise KxK, SE, pointwise back: MobileNet-V2's cheaper form).
    ``elastic: width`` with a ``path`` makes that path a width-elastic family (each stage's channels and each op's
    expanded width are dimensions; issue 25's "FjORD on the supernet's ops")."""

    name: Literal["supernet"] = "supernet"
    stem_channels: int = bounded(16, ge=1)
    blocks_per_stage: tuple[int, ...] = (2, 2, 2)
    width_mult: float = bounded(1.5, gt=0.0)
    ops: tuple[str, ...] = SUPERNET_OPS
    mbconv: Literal["official", "separable"] = "official"
    # A realised path (FedorAS's per-tier models): one op of ``ops`` per searchable block; the model then holds only
    # those ops, a stand-alone network whose tensors have the supernet's names. Empty: the whole supernet.
    path: tuple[str, ...] = ()
    # What a sub-model may shrink. ``ops`` (FedorAS's): which ops each searchable block holds. ``width`` (needs a
    # ``path``): the realised path as a width-elastic network, so any width method (FjORD, HeteroFL, ...) runs on a
    # ResNet of the supernet's own ops: the channels of each stage's residual stream and each op's expanded width
    # (its SE's too) are dimensions of which a sub-model keeps the first units.
    elastic: Literal["ops", "width"] = "ops"


@dataclass(frozen=True, kw_only=True)
class CellNetConfig:
    """A transformable network whose every conv and linear layer is a cell (FedTrans, paper 002; rayfl/models/cellnet).

    ``base``: ``cnn`` (HeteroFL's conv net, ``channels`` = conv widths, default 16-32-64), ``resnet`` (a small
    ResNet-18: ``channels`` = stage widths, default 16-32-64-128, ``blocks`` per stage) or ``mobilenet_v3_small``
    (torchvision's layer table; ``channels``, ``blocks`` and ``norm`` unused), ``mobilenet_tiny`` (the same kinds of
    block at CPU size: 3 inverted residual blocks, 15 candidate cells; ``channels``, ``blocks``, ``norm`` unused) or
    ``nb201`` (NAS-Bench-201's base network at CPU size: ``channels`` = stage widths, default 4-8, one fixed cell per
    stage, a residual reduction block between; ``blocks`` and ``norm`` unused). ``transforms``: the transformation log
    applied to the base in order, each ``widen CELL FACTOR``, ``deepen CELL`` or ``reset`` (FedTrans writes it; a
    model FedTrans produced can be trained by any method by copying its log). ``scaler``: HeteroFL's
    divide-by-width-rate after every cell of a sub-model. ``head_pool``: the classifier reads the features averaged
    to ``head_pool`` x ``head_pool`` (1 = global pooling, HeteroFL's; more keeps where things are, which rayfl's
    synthetic images label by). ``deepen_width``: ``own`` (paper 002 Fig. 5): a cell inserted by ``deepen`` writes a
    dimension of its own, so it and the cell before it are widened independently; ``shared``: the inserted cell
    writes its predecessor's dimension and widening either widens both (rayfl before issue 24). A cell whose output
    is added to a value from before it (a residual branch's last conv) always shares: its width is the stream's.
    """

    name: Literal["cellnet"] = "cellnet"
    base: Literal["cnn", "resnet", "mobilenet_v3_small", "mobilenet_tiny", "nb201"] = "cnn"
    channels: tuple[int, ...] = ()
    blocks: tuple[int, ...] = (2, 2, 2, 2)
    norm: Literal["batch", "group", "none"] = "batch"
    scaler: bool = False
    head_pool: int = bounded(1, ge=1)  # cnn/resnet: average-pool to head_pool x head_pool before the classifier
    transforms: tuple[str, ...] = ()
    deepen_width: Literal["own", "shared"] = "own"  # whether a deepened cell's inserted cell gets its own width


@dataclass(frozen=True, kw_only=True)
class EnsembleConfig:
    """SplitMix's model (Hong et al., ICLR 2022; ``rayfl/models/ensemble.py``): ``members`` independent copies (base
    models) of the cell network ``base`` at ``width`` of its every free dimension (the authors' ``atom_slim_ratio``;
    ``ceil(width x size)`` channels), their parameters stacked along a leading member axis. It predicts the mean of
    its members' logits; a sub-model is a subset of members. Paper 002 gives SplitMix FedTrans's largest model: copy
    its ``transforms`` into ``base``."""

    name: Literal["ensemble"] = "ensemble"
    base: CellNetConfig = field(default_factory=CellNetConfig)
    members: int = bounded(8, ge=1)
    width: float = bounded(0.125, gt=0.0, le=1.0)


@dataclass(frozen=True, kw_only=True)
class CustomModelConfig:
    """A user's own fixed model: ``factory`` ("package.module:function") returns an ``nn.Module`` whose forward maps a
    batch to logits ``[batch, num_classes]``; it is called with ``kwargs`` (plus ``num_classes`` and ``input_shape``
    when it takes them and ``kwargs`` does not set them). Sub-model methods need an ``ElasticFamily`` instead."""

    name: Literal["custom"] = "custom"
    factory: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)


ModelConfig = (
    CharLSTMConfig
    | CharTransformerConfig
    | CNNConfig
    | ResNetConfig
    | ViTConfig
    | CharBertConfig
    | FemnistCNNConfig
    | MLPConfig
    | SupernetConfig
    | CellNetConfig
    | EnsembleConfig
    | CustomModelConfig
)


def as_model_config(architecture: ModelArchitecture) -> ModelConfig:
    """A global model's architecture as a message carries it (``TrainTask.model_config``, ``ServerState.models``:
    typed structurally, as core knows no config) read back as the model section it is."""
    if not isinstance(architecture, ModelConfig):
        raise TypeError(f"a model architecture must be a model section, got {type(architecture).__name__}")
    return architecture


def as_model_configs(architectures: Iterable[ModelArchitecture]) -> tuple[ModelConfig, ...]:
    """Every architecture of ``architectures`` read back as its model section (``as_model_config``), in order."""
    return tuple(as_model_config(a) for a in architectures)


MODEL_CONFIGS: dict[str, type[Any]] = {
    "char_lstm": CharLSTMConfig,
    "char_transformer": CharTransformerConfig,
    "cnn": CNNConfig,
    "resnet": ResNetConfig,
    "vit": ViTConfig,
    "char_bert": CharBertConfig,
    "femnist_cnn": FemnistCNNConfig,
    "mlp": MLPConfig,
    "supernet": SupernetConfig,
    "cellnet": CellNetConfig,
    "ensemble": EnsembleConfig,
    "custom": CustomModelConfig,
}
