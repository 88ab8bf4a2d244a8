"""The configuration sections of FedorAS's three phases (paper 003): supernet training, search, per-tier fine-tuning,
and the device tiers they share. Imports neither torch nor Ray: the registry and ``rayfl validate`` read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfl.config.fields import bounded

__all__ = ["FedorASConfig", "FedorASFinetuneConfig", "FedorASSearchConfig", "FedorASTiersConfig"]


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
    before); children outside the bracket are scored by their negative distance to it. ``method: supernet_random``
    draws every generation's children as fresh random valid paths, scored with the supernet's weights like NSGA-II's
    (random search in the supernet: not paper 003's App. E baseline, which trains sampled architectures from
    scratch). ``max_evaluations``: a tier
    breeds no more children once this many of its in-bracket paths were evaluated (the official budget: 1,000 per
    tier; 0 = none, ``rounds`` alone bounds the search; as in the official loop, the last generation may overshoot by
    fewer than ``parents``). Fitness: accuracy on ``val_examples`` examples drawn once from the held-out validation
    set (``validation: held_out``, the paper's; needs ``data.val_fraction``) or from the pooled training data the
    clients train on (``train``). ``workers``: parallel evaluation tasks (Ray tasks on the Ray backend). The search's
    simulated server time is modelled as the forward FLOPs of every evaluation over ``server_gflops`` (measured time
    replaces it under ``system.server_time: measured``)."""

    name: Literal["fedoras_search"] = "fedoras_search"
    method: Literal["nsga2", "supernet_random"] = "nsga2"
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
    # With architectures: random, which draw of in-bracket paths (0: the tier-aware FedAvg baseline's; paper 003's
    # App. E random search trains draws 0, 1, ... from scratch and keeps the best per tier).
    draw: int = bounded(0, ge=0)
