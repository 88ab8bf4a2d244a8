"""SplitMix's model (Hong et al., ICLR 2022): independent base models whose logits are averaged.

``Ensemble`` holds ``n`` members of one architecture (a ``CellNet`` at ``EnsembleConfig.width`` of the base
network's channels), each parameter and buffer stacked along a new leading axis, so member ``i`` is index ``i`` of
every tensor and a subset of members is an index subset of that axis: the elastic machinery (``SearchSpace``, slices,
the element-wise reducer) handles it as one dimension, ``members``. A member runs as the template module called with
its slices (``torch.func.functional_call``); batch-norm statistics are updated in place in the stacked buffers.
``forward`` is the mean of the members' logits (SplitMix's mixed model); ``member_logits`` gives each member's.

The members are built one after another from the caller's generator, member 0 first, so a one-member ensemble at
width 1 is initialised exactly as the base network itself (``tests/unit/fl/test_splitmix.py`` relies on it).
Costs: parameters and bytes come from the stacked layouts (exact); FLOPs and the activations kept for backward from
one cost piece, a member run on ``n`` copies of the batch (``_Repeated``): ``n`` times one member's, as the members
never interact (the cost model needs a piece to save the same number of tensors at every width; the largest single
activation is then ``n`` times a member's, an overestimate of the transient gradient buffer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from rayfl.config.model import EnsembleConfig
from rayfl.models.cellnet.module import CellNetFamily
from rayfl.models.elastic.family import CostUnit, ElasticFamily
from rayfl.models.elastic.space import Axis, Dimension, SearchSpace, TensorLayout

__all__ = ["Ensemble", "EnsembleFamily", "stacked_name"]

_SEP = "__"  # a member tensor "layers.c1.weight" is stored as "members.layers__c1__weight"


def stacked_name(name: str) -> str:
    return "members." + name.replace(".", _SEP)


class Ensemble(nn.Module):
    """``len(members)`` copies of one architecture, stacked (module docstring); ``make`` builds one member."""

    def __init__(self, make: Callable[[], nn.Module], count: int, track_stats: bool = True) -> None:
        super().__init__()
        built = [make() for _ in range(count)]
        self.count = count
        self.__dict__["_template"] = built[0]  # not a submodule: its own tensors are never used
        self.members = nn.Module()
        for name, _ in built[0].named_parameters():
            stacked = torch.stack([dict(m.named_parameters())[name].detach() for m in built])
            self.members.register_parameter(name.replace(".", _SEP), nn.Parameter(stacked))
        self._buffers_of: list[str] = []
        for name, b in built[0].named_buffers():
            if not b.is_floating_point() or not track_stats:
                continue
            stacked = torch.stack([dict(m.named_buffers())[name].detach() for m in built])
            self.members.register_buffer(name.replace(".", _SEP), stacked)
            self._buffers_of.append(name)
        if not track_stats:
            for module in built[0].modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.track_running_stats = False
                    module.running_mean = None
                    module.running_var = None

    @property
    def template(self) -> nn.Module:
        module: nn.Module = self.__dict__["_template"]
        return module

    def _apply(self, fn: Any, recurse: bool = True) -> Ensemble:  # .to(device) moves the template's buffers too
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self.template._apply(fn, recurse)  # type: ignore[no-untyped-call]
        return self

    def train(self, mode: bool = True) -> Ensemble:
        super().train(mode)
        self.template.train(mode)
        return self

    def member_logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every member's logits on ``x``, in member order."""
        tensors = dict(self.members.named_parameters()) | dict(self.members.named_buffers())
        out = []
        for i in range(self.count):
            own = {name.replace(_SEP, "."): t[i] for name, t in tensors.items()}
            out.append(functional_call(self.template, own, (x,), strict=False))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack(self.member_logits(x)).mean(dim=0)


class EnsembleFamily(ElasticFamily):
    """The elastic family of an ``Ensemble``: one dimension, ``members``; every tensor's leading axis is on it."""

    def __init__(self, cfg: EnsembleConfig, in_channels: int, num_classes: int, image_size: int) -> None:
        self.cfg = cfg
        self.image = (in_channels, image_size, image_size)
        self.base = CellNetFamily(cfg.base, in_channels, num_classes, image_size)
        space = self.base.space
        self.member_units = space.units(tuple(cfg.width for _ in space.dims))
        with torch.random.fork_rng(devices=[]):
            shapes = {k: tuple(v.shape) for k, v in self._member().state_dict().items() if v.is_floating_point()}
        layouts = {
            stacked_name(k): TensorLayout((cfg.members, *s), (Axis(0), *(None for _ in s))) for k, s in shapes.items()
        }
        self.space = SearchSpace((Dimension("members", cfg.members),), layouts)

    def _member(self, track_stats: bool | None = None) -> nn.Module:
        return self.base.build(self.member_units, track_stats=True if track_stats is None else track_stats)

    def build(self, units: Sequence[int], track_stats: bool | None = None) -> nn.Module:
        """``units[0]`` members; batch-norm statistics are tracked by the whole ensemble only (as ``CellNetFamily``:
        a sub-model uses batch statistics, the SplitMix authors' ``no_track_stat``) unless ``track_stats`` says."""
        count = int(units[0])
        track = count == self.cfg.members if track_stats is None else track_stats
        return Ensemble(lambda: self._member(track), count, track)

    def cost_units(self) -> list[CostUnit]:
        key = ("ensemble", self.cfg.base, self.member_units, self.image)

        def make(widths: tuple[int, ...]) -> tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]:
            module = _Repeated(self._member(True), int(widths[0]))

            def make_input(batch: int, device: torch.device) -> torch.Tensor:
                return torch.randn((batch, *self.image), device=device)

            return module, make_input

        return [CostUnit(key, (0,), None, make)]


class _Repeated(nn.Module):
    """A member on ``count`` copies of its input batch (the ensemble's cost piece, module docstring)."""

    def __init__(self, member: nn.Module, count: int) -> None:
        super().__init__()
        self.member = member
        self.count = count

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.member(x.repeat(self.count, *(1 for _ in x.shape[1:])))
        return out
