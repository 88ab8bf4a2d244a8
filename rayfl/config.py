"""The experiment schema: frozen, typed dataclasses that one YAML file fills.

The YAML mirrors this tree. ``rayfl.config_loader`` turns a file (plus ``a.b=c`` overrides) into an
``ExperimentConfig`` and refuses unknown keys, wrong types, out-of-range values and missing files before anything
runs. Numeric bounds live in field metadata (``bounded``); sections with variants (model, algorithm) are tagged by
their ``name`` key and looked up in the explicit tables below.

Importing this module imports neither torch nor Ray, so ``rayfl validate`` is instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, cast

__all__ = [
    "ALGORITHM_CONFIGS",
    "FLOAT32_MAX",
    "MODEL_CONFIGS",
    "SUPERNET_OPS",
    "AlgorithmConfig",
    "AnyCostFLConfig",
    "BackendConfig",
    "CNNConfig",
    "CellNetConfig",
    "CharBertConfig",
    "CharLSTMConfig",
    "CharTransformerConfig",
    "CheckpointConfig",
    "CompressionConfig",
    "CustomModelConfig",
    "DataConfig",
    "DecoupleConfig",
    "DistillConfig",
    "ExperimentConfig",
    "ExportConfig",
    "FedAvgConfig",
    "FedDropoutConfig",
    "FedHeNConfig",
    "FedResCuEConfig",
    "FedRolexConfig",
    "FedRushConfig",
    "FedSeqConfig",
    "FedSlimConfig",
    "FedTransConfig",
    "FedorASConfig",
    "FedorASFinetuneConfig",
    "FedorASSearchConfig",
    "FedorASTiersConfig",
    "FemnistCNNConfig",
    "FjORDConfig",
    "HeteroFLConfig",
    "IndependentConfig",
    "LinkConfig",
    "ModelConfig",
    "ModelSearchConfig",
    "NoSideConfig",
    "PhaseConfig",
    "ResNetConfig",
    "ResourceConfig",
    "SupernetConfig",
    "SystemConfig",
    "TrackingConfig",
    "TrainConfig",
    "ViTConfig",
    "bounded",
    "method_activations",
    "official_activation",
]


def bounded(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    path: Literal["file", "dir"] | None = None,
) -> Any:
    """A dataclass field with numeric bounds (and, for strings, an existence check) that the loader enforces."""
    meta = {k: v for k, v in {"ge": ge, "gt": gt, "le": le, "lt": lt, "path": path}.items() if v is not None}
    return field(default=default, metadata=meta)


# The largest float32: a client learning rate above it cannot scale float32 parameters (torch's optimizers raise).
FLOAT32_MAX = 3.4028234663852886e38


# ----------------------------------------------------------------------------------------------------- data
@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the data comes from and how it is split into clients.

    ``partition: natural`` keeps the source's own users (Shakespeare roles, FEMNIST writers); ``iid`` and
    ``dirichlet`` split a centralised training set (CIFAR-10) into ``num_clients`` shards.
    """

    name: Literal["shakespeare", "cifar10", "leaf", "synthetic", "custom"] = "shakespeare"
    # 'custom': "package.module:function" returning a FederatedDataset, or a mapping of arrays (x, y, x_test, y_test)
    # that ``partition`` (iid or dirichlet) splits into ``num_clients`` clients; ``kwargs`` are passed to it
    factory: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    root: str | None = bounded(None, path="dir")  # local copy of the data; None = rayfl's cache directory
    download: bool = False  # allow torchvision to download CIFAR-10 (needs internet)
    partition: Literal["natural", "iid", "dirichlet"] = "natural"
    dirichlet_alpha: float = bounded(0.5, gt=0.0)
    num_clients: int = bounded(100, ge=1)  # iid/dirichlet: clients made; natural: at most this many kept (0 = all)
    min_samples: int = bounded(64, ge=1)  # natural users with fewer training samples are dropped (LEAF-style)
    max_samples_per_client: int = bounded(0, ge=0)  # 0 = no cap; a cap keeps CPU-sized runs small
    test_fraction: float = bounded(0.1, gt=0.0, lt=1.0)  # per-client test split for natural data
    # data without per-client test sets (iid/dirichlet splits, synthetic): hold out this fraction of every client's
    # samples as its own test set (0 = none); the global test set becomes their union. Gives the average client
    # accuracy (paper 002) on data split by a partitioner
    client_test_fraction: float = bounded(0.0, ge=0.0, lt=1.0)
    # hold out this fraction of every client's training samples as the server's validation set, which no client trains
    # on (0 = none: the clients keep every sample). FedorAS's search scores its candidates on it (paper 003 Sec. 3.2
    # and App. J.1: "a held-out portion of the clients' datasets"); other methods only lose the held-out samples
    val_fraction: float = bounded(0.0, ge=0.0, lt=1.0)
    seq_len: int = bounded(80, ge=2)  # Shakespeare window (LEAF uses 80)
    edition: Literal["modern", "folio", "both"] = "modern"  # which Shakespeare files are parsed
    synthetic_samples: int = bounded(64, ge=1)  # 'synthetic': samples per client (benchmarks, tests)
    # 'synthetic': weight of independent pixel noise in the images; below 1 they are mostly the constant 8x8 blocks
    # whose means the labels come from, a task small conv nets learn in far fewer steps (1 = pure noise images)
    synthetic_noise: float = bounded(1.0, ge=0.0, le=1.0)
    # Image inputs: 'dataset' normalises every sample with the data set's channel statistics; 'client' has each client
    # normalise its training samples to zero mean and unit variance per channel with its own statistics before
    # training starts (paper 000, Sec. 3.3: what makes the server's N(0, 1) distillation inputs match the data).
    # Evaluation on the server uses the data set's statistics (the server never sees a client's).
    normalize: Literal["dataset", "client"] = "dataset"


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


SUPERNET_OPS = ("conv1", "ds3_e0.5", "ds3_e1", "ds3_e2", "mb1_e2", "mb3_e0.5", "mb3_e1", "mb3_e2", "identity")


@dataclass(frozen=True, kw_only=True)
class SupernetConfig:
    """FedorAS's supernet (paper 003 Sec. 3, official ``resnet_model.py``): a 3x3 stem of ``stem_channels``, then per
    stage ``blocks_per_stage`` searchable blocks, each a choice among ``ops`` (``conv1``: standard 1x1 conv;
    ``ds3_eE``: depthwise-separable 3x3 with expansion E; ``mbK_eE``: MBConv with kernel K and expansion E;
    ``identity``: the block is skipped, so depth is searchable), and a strided reduction between stages that
    multiplies the channels by ``width_mult``; global pooling and a linear classifier. The paper's CIFAR-10 space is
    ``stem_channels: 64``, ``blocks_per_stage: [4, 4, 4, 4]`` and all nine ops."""

    name: Literal["supernet"] = "supernet"
    stem_channels: int = bounded(16, ge=1)
    blocks_per_stage: tuple[int, ...] = (2, 2, 2)
    width_mult: float = bounded(1.5, gt=0.0)
    ops: tuple[str, ...] = SUPERNET_OPS
    # A realised path (FedorAS's per-tier models): one op of ``ops`` per searchable block; the model then holds only
    # those ops, a stand-alone network whose tensors have the supernet's names. Empty: the whole supernet.
    path: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class CellNetConfig:
    """A transformable network whose every conv and linear layer is a cell (FedTrans, paper 002; rayfl/models/cellnet).

    ``base``: ``cnn`` (HeteroFL's conv net, ``channels`` = conv widths, default 16-32-64), ``resnet`` (a small
    ResNet-18: ``channels`` = stage widths, default 16-32-64-128, ``blocks`` per stage) or ``mobilenet_v3_small``
    (torchvision's layer table; ``channels``, ``blocks`` and ``norm`` unused). ``transforms``: the transformation log
    applied to the base in order, each ``widen CELL FACTOR``, ``deepen CELL`` or ``reset`` (FedTrans writes it; a
    model FedTrans produced can be trained by any method by copying its log). ``scaler``: HeteroFL's
    divide-by-width-rate after every cell of a sub-model. ``head_pool``: the classifier reads the features averaged
    to ``head_pool`` x ``head_pool`` (1 = global pooling, HeteroFL's; more keeps where things are, which rayfl's
    synthetic images label by).
    """

    name: Literal["cellnet"] = "cellnet"
    base: Literal["cnn", "resnet", "mobilenet_v3_small"] = "cnn"
    channels: tuple[int, ...] = ()
    blocks: tuple[int, ...] = (2, 2, 2, 2)
    norm: Literal["batch", "group", "none"] = "batch"
    scaler: bool = False
    head_pool: int = bounded(1, ge=1)  # cnn/resnet: average-pool to head_pool x head_pool before the classifier
    transforms: tuple[str, ...] = ()


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
    | SupernetConfig
    | CellNetConfig
    | CustomModelConfig
)
MODEL_CONFIGS: dict[str, type[Any]] = {
    "char_lstm": CharLSTMConfig,
    "char_transformer": CharTransformerConfig,
    "cnn": CNNConfig,
    "resnet": ResNetConfig,
    "vit": ViTConfig,
    "char_bert": CharBertConfig,
    "femnist_cnn": FemnistCNNConfig,
    "supernet": SupernetConfig,
    "cellnet": CellNetConfig,
    "custom": CustomModelConfig,
}


# ------------------------------------------------------------------------------------------------ algorithms
HETEROFL_RATES = (1.0, 0.5, 0.25, 0.125, 0.0625)  # HeteroFL's model levels a-e


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """Federated in-place distillation (paper 000, Sec. 3.3, Algorithm 1), run on the server after aggregation.

    ``subnets`` sub-nets (n; 0 = the round's ``clients_per_round``, as the paper) are drawn uniformly from the search
    space (``ratios``, its S; empty: the method's own ratios or rates). Each of ``iterations`` (T_SKD) iterations gives
    every sub-net ``batch_size`` (K) fresh Gaussian inputs and a KL loss (``temperature``) against the global model's
    outputs. ``update``: ``shared`` (the paper's Eq. 2) runs the sub-nets on the global model's own weights and takes
    one Adam step (``lr``) on them with the sub-nets' gradients averaged per element over the sub-nets holding it, the
    teacher being the current global model; ``copies`` (rayfl's earlier variant, kept for comparison) trains a copy
    of each sub-net with its own Adam against the global model frozen at the round's start and then replaces every
    covered element by the copies' mean. ``optimizer_state`` (``shared`` only): ``round`` starts Adam afresh each
    round, ``run`` keeps its moments across rounds in ``ServerState.opt_state``. ``teacher`` (``shared`` only):
    ``step`` is the paper's ``W^{t-1}``, the global model before each step; ``round`` freezes it at the aggregated
    model for the whole round (an ablation: the teacher no longer moves with the weights it shares). ``optimizer``:
    ``adam`` (the paper's) or ``sgd`` (plain steps of ``lr`` times the gradient: an ablation, whose steps scale with
    the KD gradient where Adam's are about ``lr`` whatever its size).
    """

    enabled: bool = False
    subnets: int = bounded(0, ge=0)
    iterations: int = bounded(100, ge=0)
    batch_size: int = bounded(64, ge=1)
    lr: float = bounded(1e-3, gt=0.0)
    temperature: float = bounded(1.0, gt=0.0)
    ratios: tuple[float, ...] = ()
    update: Literal["shared", "copies"] = "shared"
    optimizer_state: Literal["round", "run"] = "round"
    teacher: Literal["step", "round"] = "step"
    optimizer: Literal["adam", "sgd"] = "adam"


@dataclass(frozen=True, kw_only=True)
class FedAvgConfig:
    """FedAvg (McMahan et al., AISTATS 2017): one model everywhere, server step = SGD on the pseudo-gradient.

    ``model``: ``full`` is the global model (paper 000's "Largest"); ``smallest`` is the smallest structure of the
    search space with ratios ``ratios`` (paper 000's "Smallest"). ``budgets: ignore`` runs every sampled client even
    when its model exceeds a budget (the "Largest" upper bound), and records how often it would not have fit.
    """

    name: Literal["fedavg"] = "fedavg"
    weighting: Literal["samples", "uniform"] = "samples"  # client weight in the element-wise mean
    server_lr: float = bounded(1.0, gt=0.0)  # 1.0 = plain averaging
    server_momentum: float = bounded(0.0, ge=0.0, lt=1.0)
    model: Literal["full", "smallest"] = "full"
    ratios: tuple[float, ...] = (0.0, 0.5, 1.0)
    budgets: Literal["enforce", "ignore"] = "enforce"


@dataclass(frozen=True, kw_only=True)
class HeteroFLConfig:
    """HeteroFL (Diao et al., ICLR 2021): each client the largest uniform width rate of ``rates`` that fits its
    budgets, first-k channels; count-normalised element-wise mean; classifier rows of the client's labels only
    (``label_mask``, with absent classes' logits masked to 0 in the loss); static BN on the server for evaluation
    (``static_bn``, models with batch norm only); ``official_init``: the official code's initial model (norm weight
    1 and bias 0, linear biases 0); the static-BN pass runs over a seeded shuffle of the pooled training set
    (``static_bn_shuffle``) in batches of ``static_bn_batch_size`` samples, as the official code.

    The official code's training set-up as defaults, so that a paper setting run with ``algorithm.name=heterofl`` is
    set up as its authors ran it: ``grad_clip_norm``, the gradient-norm clipping of every local step (both official
    codes clip at 1), used by the method in place of ``train.grad_clip_norm`` (0: no clipping; null:
    ``train.grad_clip_norm``); ``act: official`` replaces ``model.act`` by the activation of the official codes'
    models, which is the model family's default (ResNet: ReLU; ViT and the character BERT: GELU, as the official
    transformers), since paper 000 adds ReLU6 for its own search space only (Sec. 3.4: its blocks can be skipped) and
    says nothing about its baselines' activation; ``act: model`` keeps ``model.act`` (e.g. ReLU6). Models without an
    activation choice keep theirs; in a run with phases, the phases must agree on the activation."""

    name: Literal["heterofl"] = "heterofl"
    rates: tuple[float, ...] = HETEROFL_RATES
    label_mask: bool = True
    static_bn: bool = True
    official_init: bool = True
    static_bn_shuffle: bool = True
    static_bn_batch_size: int = 10
    grad_clip_norm: float | None = bounded(1.0, ge=0.0)
    act: Literal["official", "model"] = "official"
    distill: DistillConfig = field(default_factory=DistillConfig)


@dataclass(frozen=True, kw_only=True)
class FedRolexConfig:
    """FedRolex (Alam et al., NeurIPS 2022): HeteroFL's rate choice with a rolling window of channels whose start
    moves by one unit per round; no static BN. ``official_init``: the official code's initial model (it builds its
    models with HeteroFL's ``init_param``: norm weight 1 and bias 0, linear biases 0). The official code's training
    set-up as defaults: ``grad_clip_norm`` and ``act`` as HeteroFL's (``HeteroFLConfig``)."""

    name: Literal["fedrolex"] = "fedrolex"
    rates: tuple[float, ...] = HETEROFL_RATES
    label_mask: bool = True
    official_init: bool = True
    grad_clip_norm: float | None = bounded(1.0, ge=0.0)
    act: Literal["official", "model"] = "official"
    distill: DistillConfig = field(default_factory=DistillConfig)


@dataclass(frozen=True, kw_only=True)
class FedDropoutConfig:
    """Federated Dropout (Caldas et al., 2018): the largest fitting rate, channels drawn at random (per client and
    round with ``per_client``, else one draw per round shared by every client), residual streams kept aligned."""

    name: Literal["feddropout"] = "feddropout"
    rates: tuple[float, ...] = HETEROFL_RATES
    per_client: bool = True
    label_mask: bool = False
    distill: DistillConfig = field(default_factory=DistillConfig)


@dataclass(frozen=True, kw_only=True)
class AnyCostFLConfig:
    """AnyCostFL (Li et al., INFOCOM 2023): the largest fitting rate, the channels with the largest L2 norm (one
    ordering per residual stream, so residual adds stay aligned)."""

    name: Literal["anycostfl"] = "anycostfl"
    rates: tuple[float, ...] = HETEROFL_RATES
    label_mask: bool = False
    distill: DistillConfig = field(default_factory=DistillConfig)


@dataclass(frozen=True, kw_only=True)
class FjORDConfig:
    """FjORD (Horváth et al., NeurIPS 2021): ordered dropout; each client's maximum width is the largest of
    ``widths`` that fits its budgets, and every batch trains one width drawn uniformly from those up to it;
    ``kd``: self-distillation from the maximum width; sample-weighted element-wise mean."""

    name: Literal["fjord"] = "fjord"
    widths: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
    kd: bool = True
    distill: DistillConfig = field(default_factory=DistillConfig)


@dataclass(frozen=True, kw_only=True)
class ModelSearchConfig:
    """Dynamic model search with federated in-place distillation (paper 000): each client the structure with the
    largest ``criterion`` that fits its memory and bandwidth, found in a sampling pool grown by epsilon / ``t_max``
    constrained random search over per-dimension ratios ``ratios`` (S; 0 removes a skippable block); count-normalised
    element-wise mean; in-place distillation on Gaussian inputs after aggregation (``distill``)."""

    name: Literal["model_search"] = "model_search"
    ratios: tuple[float, ...] = (0.0, 0.5, 1.0)
    epsilon: float = bounded(0.8, ge=0.0, le=1.0)
    t_max: int = bounded(5, ge=0)
    criterion: Literal["params", "memory", "bytes"] = "params"
    admit: Literal["all", "fitting"] = "all"
    distill: DistillConfig = field(default_factory=lambda: DistillConfig(enabled=True))


@dataclass(frozen=True, kw_only=True)
class FedorASTiersConfig:
    """FedorAS's device tiers (paper 003 App. D.4 and App. I): ``len(shares)`` tiers holding these shares of the
    clients. ``by: shares``: a seeded shuffle of the clients cut at the shares (the official code's 4 x 25 %);
    ``by: compute``: the clients ranked by their compute speed (``system.compute`` at the first round's check-in,
    slowest first, ties in seeded random order) and cut at the same shares, so faster devices are in higher tiers
    (App. I's allocation from a device-capability trace). The FLOPs bracket of tier ``t`` comes from the sorted FLOPs
    of ``bracket_paths`` random paths (lower limit: the quantile ``bracket_low`` of their cumulative sum, upper: the
    quantile ``bracket_high``, split evenly; the top tier ends at the supernet's largest path)."""

    by: Literal["shares", "compute"] = "shares"
    shares: tuple[float, ...] = (0.25, 0.25, 0.25, 0.25)
    bracket_paths: int = bounded(100_000, ge=10)
    bracket_low: float = bounded(0.0, ge=0.0, lt=1.0)
    bracket_high: float = bounded(0.95, gt=0.0, le=1.0)


@dataclass(frozen=True, kw_only=True)
class FedorASConfig:
    """FedorAS supernet training (paper 003 Sec. 3.2-3.3, App. D.4; ALGORITHMS.md section 10).

    Clients are split into ``tiers``, each with a FLOPs bracket. Per round one subspace whose parameters fit
    ``subspace_params`` (0: half of the supernet's parameters, the paper's ResNet-18-sized limit for its 22.3 M
    supernet) is sent to every client (Eq. 2); every batch trains one path drawn within the client's tier FLOPs
    (Eq. 3-4); OPA aggregation (Eq. 5)."""

    name: Literal["fedoras"] = "fedoras"
    tiers: FedorASTiersConfig = field(default_factory=FedorASTiersConfig)
    subspace_params: int = bounded(0, ge=0)
    eval_path: Literal["largest", "smallest"] = "largest"  # the path the engine evaluates after each round


@dataclass(frozen=True, kw_only=True)
class FedorASSearchConfig:
    """FedorAS's search phase (paper 003 Sec. 3.4, official ``search.py``/``nsga2.py``): per tier, a population of
    ``population`` valid paths (inside the tier's FLOPs bracket) scored by validation accuracy with the supernet's
    weights, then one NSGA-II generation per round of ``parents`` children (parents by binary tournament on rank and
    crowding, uniform crossover, per-layer mutation with probability ``mutation``; every child a path not scored
    before); children outside the bracket are scored by their negative distance to it. ``method: random`` draws every
    generation's children as fresh random valid paths (the paper's appendix baseline). ``max_evaluations``: a tier
    breeds no more children once this many of its in-bracket paths were evaluated (the official budget: 1,000 per
    tier; 0 = none, ``rounds`` alone bounds the search; as in the official loop, the last generation may overshoot by
    fewer than ``parents``). Fitness: accuracy on ``val_examples`` examples drawn once from the held-out validation
    set (``validation: held_out``, the paper's; needs ``data.val_fraction``) or from the pooled training data the
    clients train on (``train``). ``workers``: parallel evaluation tasks (Ray tasks on the Ray backend). The search's
    simulated server time is modelled as the forward FLOPs of every evaluation over ``server_gflops`` (measured time
    replaces it under ``system.server_time: measured``)."""

    name: Literal["fedoras_search"] = "fedoras_search"
    method: Literal["nsga2", "random"] = "nsga2"
    population: int = bounded(128, ge=2)
    parents: int = bounded(64, ge=2)
    mutation: float = bounded(0.1, ge=0.0, le=1.0)
    max_evaluations: int = bounded(0, ge=0)
    validation: Literal["held_out", "train"] = "held_out"
    val_examples: int = bounded(1000, ge=1)
    eval_batch_size: int = bounded(256, ge=1)
    workers: int = bounded(2, ge=1)
    server_gflops: float = bounded(1000.0, gt=0.0)


@dataclass(frozen=True, kw_only=True)
class FedorASFinetuneConfig:
    """FedorAS's per-tier fine-tuning (paper 003 Sec. 3.3, official ``finetune.py``): one stand-alone model per tier
    (its path realised, ``model.path``), all trained in one run with FedAvg, tier ``t``'s model on the clients of tier
    ``t`` and every higher tier. ``architectures``: ``searched`` takes each tier's best path from the preceding search
    phase; ``random`` draws one valid path per tier inside its FLOPs bracket (the paper's tier-aware FedAvg baseline,
    Fig. 3); ``given`` uses ``paths`` (one list of op names per tier). ``init``: ``supernet`` copies the weights from
    the supernet (FedorAS), ``random`` initialises every model afresh (the paper's rand-init baseline, Tab. 5).
    ``tiers``: the tiers of a run that starts with this phase; after a FedorAS phase they are inherited (leave it
    unset)."""

    name: Literal["fedoras_finetune"] = "fedoras_finetune"
    architectures: Literal["searched", "random", "given"] = "searched"
    paths: tuple[tuple[str, ...], ...] = ()
    init: Literal["supernet", "random"] = "supernet"
    tiers: FedorASTiersConfig | None = None


COLUMN_RATIOS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)  # columns of 1/8 of the network (paper 004)
CAPACITIES = (0.25, 0.5, 0.75, 1.0)  # paper 004's cluster capacities P_c


@dataclass(frozen=True, kw_only=True)
class FedResCuEConfig:
    """FedResCuE (Zhu et al., ICML 2022, paper 004): each client the largest capacity of ``capacities`` that fits its
    budgets (nested first-k widths, the same ratio on every layer); per batch, progressive self-distillation over
    ``num_ratios`` (S) ordered ratios of ``ratios`` (P, relative to the client's capacity, ending at 1), each step
    cross-entropy + ``alpha`` x KL(teacher || sub-model) updating only the columns that ratio adds (``freeze``), then
    one cross-entropy step on the client's model; band-wise plain mean of the uploaded columns (Eq. 4).
    The paper's P is 0.1 to 1 in steps of 0.05."""

    name: Literal["fedrescue"] = "fedrescue"
    capacities: tuple[float, ...] = CAPACITIES
    ratios: tuple[float, ...] = COLUMN_RATIOS
    num_ratios: int = bounded(4, ge=1)
    alpha: float = bounded(1.0, ge=0.0)
    freeze: bool = True


@dataclass(frozen=True, kw_only=True)
class FedSeqConfig(FedResCuEConfig):
    """FedSeq (paper 004's ablation): FedResCuE without the distillation term (alpha = 0, no teacher pass)."""

    name: Literal["fedseq"] = "fedseq"  # type: ignore[assignment]
    alpha: float = bounded(0.0, ge=0.0, le=0.0)


@dataclass(frozen=True, kw_only=True)
class FedRushConfig(FedResCuEConfig):
    """FedRush (paper 004's baseline): FedResCuE's sampled ratios and distillation, every step updating the whole
    sub-model (no freezing of earlier columns)."""

    name: Literal["fedrush"] = "fedrush"  # type: ignore[assignment]
    freeze: bool = False


@dataclass(frozen=True, kw_only=True)
class FedSlimConfig:
    """FedSlim (paper 004's baseline, Algorithm 3): per batch, ``num_ratios`` ordered ratios of ``ratios`` (ending
    at the client's capacity); the client's whole model takes cross-entropy and every smaller width KL(the whole
    model's detached output || its own) (in-place distillation, as the paper's "learns prunable submodels purely by
    knowledge distillation"), all gradients summed into one step; sample-weighted element-wise mean (FedAvg).
    ``kd: false`` gives the smaller widths cross-entropy instead (Yu et al. 2018's slimmable training)."""

    name: Literal["fedslim"] = "fedslim"
    capacities: tuple[float, ...] = CAPACITIES
    ratios: tuple[float, ...] = COLUMN_RATIOS
    num_ratios: int = bounded(4, ge=1)
    kd: bool = True


@dataclass(frozen=True, kw_only=True)
class FedHeNConfig:
    """FedHeN (Acar & Saligrama, ICML-W 2022; paper 001): simple devices train the side-exit sub-model, complex
    devices the whole model with the side objective (the side exit's loss added on the same batch); the simple part is
    the unweighted mean over all active devices, the rest over the active complex devices. A client is complex when
    the complex model fits its budgets (``system.memory`` levels fixed by client id give the paper's split)."""

    name: Literal["fedhen"] = "fedhen"


@dataclass(frozen=True, kw_only=True)
class NoSideConfig:
    """NoSide (paper 001, Algorithm 4): FedHeN's assignment and aggregation without the side objective (HeteroFL's
    aggregation with the simple model as the complex model's early-exit sub-network)."""

    name: Literal["noside"] = "noside"


@dataclass(frozen=True, kw_only=True)
class DecoupleConfig:
    """Decouple (paper 001, Algorithm 3): two independent FedAvgs in one run, the simple model (the run's ResNet
    ending at its side exit, ``model.exit_only``) over the simple devices and the complex model over the complex ones;
    devices are typed as in FedHeN (complex when the complex model fits their budgets)."""

    name: Literal["decouple"] = "decouple"


@dataclass(frozen=True, kw_only=True)
class IndependentConfig:
    """Several independent FedAvg models in one run (a multi-model baseline, e.g. FedHeN's "Decouple"): ``num_models``
    global models of the run's architecture, each initialised from its own seed; client ``c`` always trains model
    ``c mod num_models`` and is scored on it."""

    name: Literal["independent"] = "independent"
    num_models: int = bounded(2, ge=1)
    weighting: Literal["samples", "uniform"] = "samples"


@dataclass(frozen=True, kw_only=True)
class FedTransConfig:
    """FedTrans (paper 002): a family of models grown from ``model`` (a ``cellnet``) during the run, utility-based
    soft assignment and soft aggregation (``rayfl/algorithms/fedtrans.py``).

    A transformation fires after a round in which the newest model's degree of convergence (Eq. 1: the mean of its
    last ``gamma`` training-loss slopes of step ``doc_step`` rounds) is at most ``beta``, or at a round of
    ``force_rounds``; it selects the newest model's cells whose activeness (the clients' ``|mean grad| / |w|`` over
    the last ``activeness_rounds`` rounds it trained) is at least ``alpha`` x the largest, widens each by
    ``widen_factor`` (copies get ``noise`` x the tensor's standard deviation of Gaussian noise) or deepens it if it was
    widened last time, and adds the result as a new model. ``eta``: Eq. 5's decay per round the receiving model has
    trained. Ablations: ``soft_aggregation: false`` (each model averages its own clients only), ``share_large_to_small``
    (the paper's "l2s"), ``layer_selection: random``, ``warmup: false`` (new models start from fresh weights).
    ``rescale_cropped``: a smaller model's input columns of a dimension the receiving model has widened are divided
    by the widening factor before they enter its leading slice, so they are on the receiver's scale (``false``: the
    paper's literal crop, which mixes the parent's full-scale columns with the child's columns divided by ``K``).
    A client is compatible with a model when its round's training FLOPs fit its compute budget
    (``system.compute_limit_s``); every model is compatible without one.
    """

    name: Literal["fedtrans"] = "fedtrans"
    alpha: float = bounded(0.9, ge=0.0, le=1.0)
    beta: float = 0.003
    gamma: int = bounded(10, ge=1)
    doc_step: int = bounded(5, ge=1)
    widen_factor: int = bounded(2, ge=2)
    noise: float = bounded(0.05, ge=0.0)
    eta: float = bounded(0.9, gt=0.0, le=1.0)
    soft_aggregation: bool = True
    share_large_to_small: bool = False
    rescale_cropped: bool = True
    layer_selection: Literal["activeness", "random"] = "activeness"
    warmup: bool = True
    activeness_rounds: int = bounded(5, ge=1)
    force_rounds: tuple[int, ...] = ()
    max_models: int = bounded(8, ge=1)
    transform_classifier: bool = False  # the classifier may be picked (deepened: its width is the classes)


AlgorithmConfig = (
    FedAvgConfig
    | HeteroFLConfig
    | FedRolexConfig
    | FedDropoutConfig
    | AnyCostFLConfig
    | FjORDConfig
    | ModelSearchConfig
    | FedorASConfig
    | FedorASSearchConfig
    | FedorASFinetuneConfig
    | FedResCuEConfig
    | FedSeqConfig
    | FedRushConfig
    | FedSlimConfig
    | FedHeNConfig
    | NoSideConfig
    | DecoupleConfig
    | IndependentConfig
    | FedTransConfig
)
ALGORITHM_CONFIGS: dict[str, type[Any]] = {
    "fedavg": FedAvgConfig,
    "heterofl": HeteroFLConfig,
    "fedrolex": FedRolexConfig,
    "feddropout": FedDropoutConfig,
    "anycostfl": AnyCostFLConfig,
    "fjord": FjORDConfig,
    "model_search": ModelSearchConfig,
    "fedoras": FedorASConfig,
    "fedoras_search": FedorASSearchConfig,
    "fedoras_finetune": FedorASFinetuneConfig,
    "fedrescue": FedResCuEConfig,
    "fedseq": FedSeqConfig,
    "fedrush": FedRushConfig,
    "fedslim": FedSlimConfig,
    "fedhen": FedHeNConfig,
    "noside": NoSideConfig,
    "decouple": DecoupleConfig,
    "independent": IndependentConfig,
    "fedtrans": FedTransConfig,
}


@dataclass(frozen=True, kw_only=True)
class CompressionConfig:
    """Upload compression for any method. ``qsgd``: QSGD (Alistarh et al., NeurIPS 2017; paper 000 App. G.4)
    quantises each uploaded tensor's update (trained minus received) stochastically to ``levels`` levels of its L2
    norm, sent as ``bits``-bit codes plus one float32 norm per tensor; the bytes moved (and the clock) reflect it."""

    kind: Literal["none", "qsgd"] = "none"
    levels: int = bounded(64, ge=1)
    bits: int = bounded(8, ge=2, le=32)


# ------------------------------------------------------------------------------------------- local training
@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Client-side training, identical for every client unless an algorithm overrides it."""

    epochs: int = bounded(1, ge=0)
    max_steps: int = bounded(0, ge=0)  # 0 = no cap; otherwise stop after this many batches
    batch_size: int = bounded(10, ge=1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = bounded(0.8, gt=0.0)  # at most FLOAT32_MAX (config_loader): torch refuses a larger step
    momentum: float = bounded(0.0, ge=0.0, lt=1.0)
    weight_decay: float = bounded(0.0, ge=0.0)
    grad_clip_norm: float = bounded(0.0, ge=0.0)  # 0 = no clipping
    lr_schedule: Literal["constant", "cosine", "step"] = "constant"  # over rounds, as HeteroFL's server-side LR
    lr_decay_rounds: tuple[int, ...] = ()  # 'step': rounds at which lr is multiplied by lr_decay
    lr_decay: float = bounded(0.1, gt=0.0, le=1.0)
    eval_batch_size: int = bounded(256, ge=1)
    # Token windows: 'last' trains on the character after the window (LEAF); 'all' also on the character after
    # every prefix of it (teacher forcing, 80 targets per window). Evaluation always scores the last one.
    sequence_loss: Literal["last", "all"] = "last"
    # clients return the global weights unchanged without training (for measuring the engine alone)
    noop: bool = False


# ----------------------------------------------------------------------------------------------------- system
@dataclass(frozen=True, kw_only=True)
class ResourceConfig:
    """Where one resource's per-client values come from (``rayfl/system/resources.py``).

    Units: memory ``MiB``, bandwidth ``Mbit/s``, compute ``GFLOP/s``, availability 0/1 (values in files are read in
    the unit their format declares).

    * ``none``: unlimited (the resource never constrains anyone).
    * ``constant``: ``low`` for every client.
    * ``uniform``: uniform in ``[low, high]``; ``binary``: ``low`` or ``high`` with equal odds. Drawn per client and
      round (``per_round``, paper 000 settings 3-4) or once per client.
    * ``levels``: each round the sampled clients are split into ``len(values)`` equal groups, group ``i`` getting
      ``values[i]`` (HeteroFL/FedRolex's "exactly 1/5 of the clients per model level", paper 000 settings 1-2);
      every ``levels`` resource of a run with as many values puts a client in the same group. With ``id_bounds``
      (ascending client ids, one fewer than ``values``) the level is fixed by client id instead: ids below
      ``id_bounds[0]`` get ``values[0]``, ids from ``id_bounds[i - 1]`` below ``id_bounds[i]`` get ``values[i]``
      (FedHeN's setting: the first 50 of 100 clients simple devices, the last 50 complex ones).
    * ``trace``: replay logs of ``(timestamp, value)``: ``file`` (one log) or ``directory`` (every log in it, sorted by
      name), in ``format``; clients get logs round-robin (``assign: round_robin``) or at random, start at a random
      offset into the log (``offset: random``) or at 0, and the log loops at its end. ``pattern`` picks the logs
      of a directory (``*.down``).
    * ``empirical``: values drawn per client and round from a distribution file (``format: mobilebandwidth``);
      with ``high > 0`` only the values within ``[low, high]`` are kept.
    """

    source: Literal["none", "constant", "uniform", "binary", "levels", "trace", "empirical"] = "none"
    low: float = bounded(0.0, ge=0.0)
    high: float = bounded(0.0, ge=0.0)
    values: tuple[float, ...] = ()
    id_bounds: tuple[int, ...] = ()  # levels: fixed per client by id (see above); empty = split each round's cohort
    per_round: bool = True
    file: str | None = bounded(None, path="file")
    directory: str | None = bounded(None, path="dir")
    pattern: str = "*"  # which files of ``directory`` are logs (e.g. ``*.down``); licence and readme files are skipped
    format: Literal["rayfl", "mahimahi", "pensieve", "ucc", "mobilebandwidth"] = "rayfl"
    direction: Literal["down", "up"] = "down"  # which column of a two-way log (ucc)
    technology: str = ""  # empirical mobilebandwidth: keep only tests of this technology (e.g. 4G, 5G, WiFi)
    assign: Literal["round_robin", "random"] = "round_robin"
    offset: Literal["random", "zero"] = "random"
    scale: float = bounded(1.0, gt=0.0)  # multiply every value (e.g. to map a host's free RAM onto a phone's)


@dataclass(frozen=True, kw_only=True)
class LinkConfig:
    """Unstable links (paper 004, Sec. 3.3; ``rayfl/system/links.py``), for any method.

    A model moves in ordered transfer units: columns of ``column_ratio`` of the network, i.e. the nested leading
    blocks of a client's sub-model at width ratios ``column_ratio``, ``2 x column_ratio`` ... up to its own (a model
    without an elastic family is one unit). Each unit fails with probability ``error_rate`` (drawn per client and
    round: ``constant``, ``uniform`` in ``[low, high]``, ``binary``, ``levels`` or ``trace``; ``none`` = perfect
    links); units are sent in order until the first failure, in both directions. A ``trace`` of error rates (kind
    ``link_error``, unit ``1``, values in ``[0, 1)``) is replayed per client like any trace, its times read as
    simulated seconds or, with ``trace_time: round``, as round indices (row ``t_s = r`` holds from round ``r``). With
    ``padding`` (Eq. 5) a client fills the columns it failed to download from its own parameters of the last round
    it trained (at first, the initial global model's); without it the client trains the part that arrived, and fails
    when nothing did. ``memory_dtype``: the precision in which a client remembers its model for padding
    (``float16`` halves the per-client state, e.g. 1,000 clients of the 16-32-64 CNN; padded values are then rounded
    to half precision)."""

    error_rate: ResourceConfig = field(default_factory=ResourceConfig)
    column_ratio: float = bounded(0.125, gt=0.0, le=1.0)
    padding: bool = True
    trace_time: Literal["simulated", "round"] = "simulated"
    memory_dtype: Literal["float32", "float16"] = "float32"

    def __post_init__(self) -> None:
        er = self.error_rate
        if er.source == "empirical":
            raise ValueError(
                "error_rate.source 'empirical' is not supported (constant, uniform, binary, levels, trace)"
            )
        if er.source == "trace":
            return  # its values are checked when the trace is read (system/links.py), naming the file
        values = list(er.values) if er.source == "levels" else [er.low, er.high if er.source != "constant" else 0.0]
        if er.source != "none" and any(not 0.0 <= v * er.scale < 1.0 for v in values):
            raise ValueError(
                f"error_rate values must lie in [0, 1) (a column lost with that probability), got {values}"
            )


@dataclass(frozen=True, kw_only=True)
class SystemConfig:
    """System heterogeneity: per-client budgets and the simulated clock (paper 000 Sec. 4.1.2, Appendix D).

    A client fits a round when its model's peak training memory fits its memory at the round's start and its
    download plus upload fit in ``comm_limit_s`` at its current bandwidths (and, with ``compute_limit_s``, its round's
    training FLOPs fit what its compute speed does within that limit: paper 002's hardware capacity). The clock
    integrates the bandwidth traces over the transfers, models compute time from FLOPs and ``compute`` speed (or
    measured training time x
    ``measured_time_scale``), and fails a client whose memory drops below its need while it trains or that becomes
    unavailable. Round time = slowest surviving client (+ measured server time with ``server_time: measured``).
    """

    memory: ResourceConfig = field(default_factory=ResourceConfig)
    bandwidth_down: ResourceConfig = field(default_factory=ResourceConfig)
    bandwidth_up: ResourceConfig | None = None  # None: the download source serves uploads too
    compute: ResourceConfig = field(default_factory=lambda: ResourceConfig(source="constant", low=1000.0))
    availability: ResourceConfig = field(default_factory=ResourceConfig)
    comm_limit_s: float = bounded(60.0, gt=0.0)  # the communication time limit that defines bandwidth budgets
    # the compute time limit that defines compute budgets (0: none): a client's budget is the training FLOPs it can do
    # within it at its compute speed; a model needing more fails it ("compute") and sub-model methods pick ones that fit
    compute_limit_s: float = bounded(0.0, ge=0.0)
    deadline_s: float = bounded(0.0, ge=0.0)  # 0: no deadline; else clients that would finish later are not run
    compute_time: Literal["modelled", "measured"] = "modelled"
    measured_time_scale: float = bounded(1.0, gt=0.0)
    server_time: Literal["none", "measured"] = "none"
    memory_overhead_mib: float = bounded(0.0, ge=0.0)  # runtime memory added to every model's need
    links: LinkConfig = field(default_factory=LinkConfig)  # unstable links: columns lost mid-transfer (paper 004)


# ---------------------------------------------------------------------------------------------------- backend
@dataclass(frozen=True, kw_only=True)
class BackendConfig:
    """Where clients run: in this process, or on a pool of Ray ``ClientHost`` actors with sharded aggregation;
    ``auto`` picks one per run (``rayfl/engine/backend_choice.py``: Ray for large runs, clusters and GPUs)."""

    kind: Literal["auto", "local", "ray"] = "auto"
    num_hosts: int = bounded(2, ge=1)  # ClientHost actors (the in-process backend emulates the same partition)
    num_shards: int = bounded(1, ge=1)  # parameter-server shard actors
    cpus_per_host: float = bounded(0.0, ge=0.0)  # 0 = the cluster's CPUs split evenly over the hosts (at most 1)
    gpus_per_host: float = bounded(0.0, ge=0.0, le=1.0)  # GPU share Ray reserves per host; a host trains on one GPU
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto = CUDA when the host holds a GPU share and CUDA works
    gpu_memory_fraction: float = bounded(0.0, ge=0.0, le=1.0)  # CUDA allocator cap per host; 0 = gpus_per_host if < 1
    placement: Literal["spread", "pack"] = "spread"  # outside a placement group: hosts over all nodes, or packed
    start_timeout_s: float = bounded(120.0, gt=0.0)  # wait for the actors; raise it when an autoscaler adds nodes
    cpus_per_shard: float = bounded(0.0, ge=0.0)
    torch_threads: int = bounded(1, ge=1)  # intra-op threads per host; fixed so sums are reproducible
    # intra-op threads of the driver's server work (distillation, static BN, search, local evaluation), fixed for the
    # same reason: the records of a run do not depend on the machine's core count or OMP_NUM_THREADS
    server_threads: int = bounded(1, ge=1)
    address: str | None = None  # an existing Ray cluster ("auto" or "host:port"); None = what a bare ray.init() finds
    # (RAY_ADDRESS, the last `ray start` here) or else a new local Ray
    num_cpus: int = bounded(0, ge=0)  # CPUs for a local Ray instance; 0 = all
    object_store_mb: int = bounded(0, ge=0)  # object store of a local Ray instance; 0 = Ray's default
    # dead hosts and shards are restarted and their work re-run (engine/recovery.py); the run gives up when more
    # than this many actor failures happen in one round (0 = give up at the first)
    max_actor_failures: int = bounded(3, ge=0)
    # keep the hosts and shards alive after the run for the next run in this process with the same layout
    # (notebooks, scripts running several experiments); they keep their CPU reservations meanwhile
    # (``engine/ray_pool.py``; released by ``rayfl.engine.ray_backend.release_warm_pool`` or ``shutdown_ray``)
    keep_warm: bool = False


# ------------------------------------------------------------------------------------------- checkpoints
@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Checkpoints of a written run (``rayfl/engine/checkpoint.py``), for ``rayfl run --resume RUN_DIR``: every
    ``every`` rounds, after the last round and when SIGINT/SIGTERM stops the run; the last ``keep`` are kept.
    ``every: 0`` writes none (and a stopped run cannot be resumed)."""

    every: int = bounded(10, ge=0)
    keep: int = bounded(2, ge=1)


# -------------------------------------------------------------------------------------------- model export
@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    """The trained global models a written run leaves in ``RUN_DIR/models/`` (``rayfl/engine/export.py``), loaded
    with ``rayfl.load_model``: with ``final`` every global model as it ended, with ``best`` also the evaluated state
    whose main test accuracy was the highest (``best-*.safetensors``)."""

    final: bool = True
    best: bool = False


@dataclass(frozen=True, kw_only=True)
class TrackingConfig:
    """Where a written run's metrics go besides its record files (``rayfl/engine/tracking.py``): TensorBoard event
    files in the run directory (``None``: when the ``tensorboard`` package is installed) and an MLflow run
    (``mlflow_uri``: a tracking server or store; "" is a file store ``mlruns/`` under ``output_dir``)."""

    tensorboard: bool | None = None
    mlflow: bool = False
    mlflow_uri: str = ""
    mlflow_experiment: str = ""  # "": the run's setting, or "rayfl"


# ---------------------------------------------------------------------------------------------- experiment
@dataclass(frozen=True, kw_only=True)
class PhaseConfig:
    """One phase of a multi-phase run (``rayfl/engine/phases.py``): its own algorithm for ``rounds`` rounds, and
    optionally its own clients per round, client learning rate and local epochs (FedorAS trains its supernet and
    fine-tunes with different figures, paper 003 Tab. 7-8); the learning-rate schedule runs over the phase's own
    rounds, and the clock prices the phase's epochs."""

    name: str = "phase"
    rounds: int = bounded(1, ge=1)
    algorithm: AlgorithmConfig = field(default_factory=FedAvgConfig, metadata={"tagged": ALGORITHM_CONFIGS})
    clients_per_round: int = bounded(0, ge=0)  # 0: the run's clients_per_round
    lr: float = bounded(0.0, ge=0.0)  # 0: train.lr
    epochs: int = bounded(0, ge=0)  # 0: train.epochs


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """One simulation: data, model, algorithm, local training, backend, rounds and output."""

    name: str = "experiment"
    setting: str = ""  # a label grouping runs in reports (e.g. paper 000's "setting3"); "" = the run dir's parent
    seed: int = bounded(0, ge=0)
    rounds: int = bounded(20, ge=1)
    clients_per_round: int = bounded(10, ge=1)
    eval_every: int = bounded(1, ge=1)  # evaluate the global model every N rounds (and after the last)
    # also evaluate the first-k uniform x p sub-model of the evaluated parameters at each of these width ratios, every
    # evaluated round, recorded as ``x{p}`` in evals.csv (nested-width methods: accuracy of each sub-model; needs an
    # elastic model)
    eval_widths: tuple[float, ...] = ()
    # also evaluate the all-device model every evaluated round: the reducer's mean over every client's last update
    # that reached the server (clients that never trained left out), not only this round's; paper 001 reports its
    # models so. Recorded as ``all_devices_acc``/``all_devices_loss`` (the main evaluation), ``all_devices_device_acc``
    # (the device average on it) and ``all_devices/<name>`` in evals.csv. Costs every client's last upload in memory
    eval_all_devices: bool = False
    output_dir: str = "runs"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=CharLSTMConfig, metadata={"tagged": MODEL_CONFIGS})
    algorithm: AlgorithmConfig = field(default_factory=FedAvgConfig, metadata={"tagged": ALGORITHM_CONFIGS})
    train: TrainConfig = field(default_factory=TrainConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    # Several phases, run one after another on one clock and one set of records; when given, they replace
    # ``algorithm`` and their rounds add up to ``rounds`` (``rayfl/engine/phases.py``).
    phases: tuple[PhaseConfig, ...] = ()
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # a round whose aggregate or server step is not finite is rolled back (the global model stays); this many such
    # rounds in a row stop the run with an error (engine/guard.py)
    max_nonfinite_rounds: int = bounded(3, ge=1)
    # the trained models a written run leaves in models/ (engine/export.py) and where its metrics go besides its
    # record files (engine/tracking.py)
    export: ExportConfig = field(default_factory=ExportConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        # ``algorithm.act: official`` (HeteroFL, FedRolex) sets the model's activation. It is resolved here, once,
        # so that every part of the run (driver, hosts, cost model, search, the written config) builds the same
        # model; phases that disagree are left as they are and reported by ``config_rules``.
        wanted = set(method_activations(self).values())
        if len(wanted) == 1:
            act, model = wanted.pop(), cast(Any, self.model)  # only models with an ``act`` field ask for one
            if act != model.act:
                object.__setattr__(self, "model", replace(model, act=act))

    @property
    def algorithm_label(self) -> str:
        """The run's algorithm in summaries and messages: its name, or the phases' names joined by ``+``."""
        return "+".join(p.algorithm.name for p in self.phases) if self.phases else self.algorithm.name


def official_activation(model: Any) -> str | None:
    """The activation the official baselines' codes use in ``model``'s family: the family's default ``act`` (ReLU for
    the ResNet, GELU for the transformers); ``None`` for models without an activation choice."""
    for f in fields(model):
        if f.name == "act":
            return str(f.default)
    return None


def method_activations(cfg: ExperimentConfig) -> dict[int, str]:
    """The activation each of the run's algorithms asks the model for, by phase index (0 in a run without phases):
    ``official`` gives ``official_activation``, ``model`` the model's own ``act``; algorithms without an ``act`` field,
    and models without an activation choice, ask for nothing."""
    official = official_activation(cfg.model)
    if official is None:
        return {}
    algorithms = [p.algorithm for p in cfg.phases] or [cfg.algorithm]
    wanted: dict[int, str] = {}
    for index, algorithm in enumerate(algorithms):
        choice = getattr(algorithm, "act", None)
        if choice == "official":
            wanted[index] = official
        elif choice == "model":
            wanted[index] = str(cast(Any, cfg.model).act)
    return wanted
