"""The method registry: what a config's ``algorithm.name`` means.

One row per method name: its config dataclass (imported here: config modules import no torch), where its algorithm
class lives (``"module:Class"``, imported only when a run builds it; a paper's ablations and baselines that differ only
in their config share their method's class), and where its own validation rules live, if it has
any (``"module:function"``, a function of the ``ExperimentConfig`` and the section's key path returning problems).
Adding a method is one folder under ``rayfl/fl/methods/`` and one row here. The engine and the experiment config reach
methods only through this table; importing it imports neither torch nor Ray.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayfl.fl.methods.anycostfl.config import AnyCostFLConfig
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.feddropout.config import FedDropoutConfig
from rayfl.fl.methods.fedhen.config import DecoupleConfig, FedHeNConfig, NoSideConfig
from rayfl.fl.methods.fedoras.config import FedorASConfig, FedorASFinetuneConfig, FedorASSearchConfig
from rayfl.fl.methods.fedprox.config import FedProxConfig
from rayfl.fl.methods.fedrescue.config import FedResCuEConfig, FedRushConfig, FedSeqConfig
from rayfl.fl.methods.fedrolex.config import FedRolexConfig
from rayfl.fl.methods.fedslim.config import FedSlimConfig
from rayfl.fl.methods.fedtrans.config import FedTransConfig
from rayfl.fl.methods.fjord.config import FjORDConfig
from rayfl.fl.methods.fjord004.config import FjORD004Config
from rayfl.fl.methods.fluid.config import FLuIDConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.fl.methods.independent.config import IndependentConfig
from rayfl.fl.methods.model_search.config import ModelSearchConfig
from rayfl.fl.methods.splitmix.config import SplitMixConfig

if TYPE_CHECKING:
    from rayfl.config.sections import TrainConfig
    from rayfl.fl.api.algorithm import Algorithm

__all__ = [
    "ALGORITHM_CONFIGS",
    "METHODS",
    "AlgorithmConfig",
    "Method",
    "algorithm_class",
    "build_algorithm",
    "default_algorithm_config",
    "import_object",
]


@dataclass(frozen=True)
class Method:
    """A registry row: the method's config class, its algorithm class as ``"module:Class"``, its own validation rules
    as ``"module:function"`` (or ``None``), and the paper it implements (for the README's method list)."""

    config: type[Any]
    algorithm: str
    paper: str
    rules: str | None = None


_M = "rayfl.fl.methods"

METHODS: dict[str, Method] = {
    "fedavg": Method(
        FedAvgConfig, f"{_M}.fedavg.algorithm:FedAvg", "McMahan et al., AISTATS 2017", f"{_M}.fedavg.rules:problems"
    ),
    "heterofl": Method(HeteroFLConfig, f"{_M}.heterofl.algorithm:HeteroFL", "Diao et al., ICLR 2021"),
    "fedrolex": Method(FedRolexConfig, f"{_M}.fedrolex.algorithm:FedRolex", "Alam et al., NeurIPS 2022"),
    "feddropout": Method(FedDropoutConfig, f"{_M}.feddropout.algorithm:FedDropout", "Caldas et al., 2018"),
    "anycostfl": Method(AnyCostFLConfig, f"{_M}.anycostfl.algorithm:AnyCostFL", "Li et al., INFOCOM 2023"),
    "fjord": Method(FjORDConfig, f"{_M}.fjord.algorithm:FjORD", "Horváth et al., NeurIPS 2021"),
    "model_search": Method(
        ModelSearchConfig, f"{_M}.model_search.algorithm:ModelSearchAlgorithm", "paper 000 (the core method)"
    ),
    "fedoras": Method(
        FedorASConfig, f"{_M}.fedoras.algorithm:FedorAS", "Dudziak et al., paper 003", f"{_M}.fedoras.rules:problems"
    ),
    "fedoras_search": Method(
        FedorASSearchConfig,
        f"{_M}.fedoras.search:FedorASSearch",
        "paper 003, search phase",
        f"{_M}.fedoras.rules:problems",
    ),
    "fedoras_finetune": Method(
        FedorASFinetuneConfig,
        f"{_M}.fedoras.finetune:FedorASFinetune",
        "paper 003, fine-tuning phase",
        f"{_M}.fedoras.rules:problems",
    ),
    "fedrescue": Method(FedResCuEConfig, f"{_M}.fedrescue.algorithm:FedResCuE", "Zhu et al., ICML 2022 (paper 004)"),
    "fedseq": Method(FedSeqConfig, f"{_M}.fedrescue.algorithm:FedResCuE", "paper 004's ablation (no distillation)"),
    "fedrush": Method(FedRushConfig, f"{_M}.fedrescue.algorithm:FedResCuE", "paper 004's baseline (no freezing)"),
    "fedslim": Method(FedSlimConfig, f"{_M}.fedslim.algorithm:FedSlim", "paper 004's baseline (Algorithm 3)"),
    "fjord004": Method(FjORD004Config, f"{_M}.fjord004.algorithm:FjORD004", "paper 004's FjORD (Algorithm 4)"),
    "fedhen": Method(
        FedHeNConfig,
        f"{_M}.fedhen.algorithm:FedHeN",
        "Acar & Saligrama, 2022 (paper 001)",
        f"{_M}.fedhen.rules:problems",
    ),
    "noside": Method(
        NoSideConfig, f"{_M}.fedhen.algorithm:FedHeN", "paper 001, Algorithm 4", f"{_M}.fedhen.rules:problems"
    ),
    "decouple": Method(
        DecoupleConfig, f"{_M}.fedhen.algorithm:FedHeN", "paper 001, Algorithm 3", f"{_M}.fedhen.rules:problems"
    ),
    "independent": Method(
        IndependentConfig, f"{_M}.independent.algorithm:IndependentFedAvg", "several independent FedAvg models"
    ),
    "fedtrans": Method(
        FedTransConfig,
        f"{_M}.fedtrans.algorithm:FedTrans",
        "Zhu et al., MLSys 2024 (paper 002)",
        f"{_M}.fedtrans.rules:problems",
    ),
    "fedprox": Method(FedProxConfig, f"{_M}.fedprox.algorithm:FedProx", "Li et al., MLSys 2020"),
    "fluid": Method(FLuIDConfig, f"{_M}.fluid.algorithm:FLuID", "Wang et al., NeurIPS 2023 (paper 002's baseline)"),
    "splitmix": Method(
        SplitMixConfig,
        f"{_M}.splitmix.algorithm:SplitMix",
        "Hong et al., ICLR 2022 (paper 002's baseline)",
        f"{_M}.splitmix.rules:problems",
    ),
}

# The tagged table the loader reads ``algorithm:`` and ``phases[i].algorithm:`` with.
ALGORITHM_CONFIGS: Mapping[str, type[Any]] = {name: method.config for name, method in METHODS.items()}

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
    | FjORD004Config
    | FedHeNConfig
    | NoSideConfig
    | DecoupleConfig
    | IndependentConfig
    | FedTransConfig
    | FedProxConfig
    | FLuIDConfig
    | SplitMixConfig
)


def default_algorithm_config() -> AlgorithmConfig:
    """The ``algorithm`` section of a config that names none: FedAvg."""
    return FedAvgConfig()


def import_object(path: str) -> Any:
    """The object a ``"module:name"`` path names."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm class of method ``name`` (imports the method's module, and with it torch)."""
    cls: type[Algorithm] = import_object(METHODS[name].algorithm)
    return cls


def build_algorithm(config: Any, train: TrainConfig) -> Algorithm:
    """The algorithm named by ``config.name``, configured."""
    return algorithm_class(config.name)(config, train)
