"""A tiny run of every registered algorithm, for the resume tests, and how to compare two runs' records bit for bit.

``case(name)`` gives a config for ``algorithm.name = name``: a small CNN with batch norm (HeteroFL's static BN; a
small ResNet with a side exit for FedHeN and its baselines), memory budgets drawn per client and round between a
quarter-width model's need and more than the full model's (so sub-model methods choose different widths and some
clients fail), and unstable links with padding for the nested-width methods (per-client memories). A method
registered later is covered by the defaults of its config class unless it needs its own entry in ``SPECIAL`` (a
model, a phase before it).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file

from rayfl.config.model import CellNetConfig, CNNConfig, EnsembleConfig, ResNetConfig
from rayfl.config.sections import CheckpointConfig, DataConfig, LinkConfig, ResourceConfig, SystemConfig
from rayfl.data.federated import FederatedDataset
from rayfl.engine.build import build_clock, build_setup
from rayfl.engine.driver import RunResult
from rayfl.engine.persist.checkpoint import CheckpointStore
from rayfl.engine.persist.export import exported_models
from rayfl.engine.persist.records import HOST_CLOCK_FIELDS
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedtrans.config import FedTransConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.fl.methods.model_search.config import ModelSearchConfig
from rayfl.fl.registry import ALGORITHM_CONFIGS, METHODS
from rayfl.models.elastic.spec import SubModelSpec
from tests.helpers import tiny_config
from tests.helpers_fedoras import fedoras_tiny_config

__all__ = [
    "WALL_CLOCK_COLUMNS",
    "assert_records_agree",
    "assert_same_object",
    "assert_same_run",
    "assert_same_state",
    "case",
    "case_names",
    "keep_checkpoints_up_to",
]

# Columns measured on the host's clock (and the checkpoint columns, which differ where a stop wrote an extra
# checkpoint): everything else in the records is deterministic.
WALL_CLOCK_COLUMNS = sorted(HOST_CLOCK_FIELDS | {"checkpoint_bytes"})

MODEL = CNNConfig(channels=(8, 16), norm="batch")  # batch norm: HeteroFL's static BN
SIDE_EXIT = ResNetConfig(widths=(4, 8, 8, 8), norm="gn", side_exit=2, side_pool=2)  # FedHeN's simple model
SIDE_EXIT_METHODS = ("fedhen", "noside", "decouple")
CELLNET = CellNetConfig(channels=(4, 8))  # FedTrans grows a family of cellnets
ENSEMBLE = EnsembleConfig(base=CELLNET, members=4, width=0.5)  # SplitMix's bases: clients train 1 to 4 of them
DISTILL = DistillConfig(enabled=True, iterations=2, batch_size=8)
LINKS = LinkConfig(error_rate=ResourceConfig(source="uniform", low=0.1, high=0.3))
NESTED = ("fedrescue", "fedseq", "fedrush", "fedslim", "fjord004")

# Methods whose defaults do not make a tiny, state-rich run: server momentum (optimizer state), distillation,
# a search pool that grows. FedorAS's phases run as the three-phase run of tests/helpers_fedoras.py.
SPECIAL: dict[str, Any] = {
    "fedavg": FedAvgConfig(server_lr=0.9, server_momentum=0.5),
    # the distillation's Adam moments kept across rounds (ServerState.opt_state) must survive a resume too
    "heterofl": HeteroFLConfig(distill=dataclasses.replace(DISTILL, optimizer_state="run")),
    "model_search": ModelSearchConfig(epsilon=0.3, t_max=3, distill=DISTILL),
    # models added after rounds 0 and 1: a resume lands between and after the family's growth
    "fedtrans": FedTransConfig(force_rounds=(0, 1), alpha=0.5, gamma=1, doc_step=1),
}
MODELS: dict[str, Any] = {"fedtrans": CELLNET, "splitmix": ENSEMBLE}
PHASED = ("fedoras", "fedoras_search", "fedoras_finetune")
SYNTHETIC = DataConfig(name="synthetic", partition="iid", num_clients=8, synthetic_samples=16)


def case_names() -> list[str]:
    return sorted(METHODS)


def case(name: str, data: FederatedDataset | None, rounds: int = 4) -> ExperimentConfig:
    """A tiny, written, checkpointed run of algorithm ``name`` (every round checkpointed, all checkpoints kept); with
    ``data`` None its data is the config's own synthetic set (for runs started from a YAML file)."""
    checkpoint = CheckpointConfig(every=1, keep=1000)
    if name in PHASED:  # supernet 2 rounds, search 3, per-tier fine-tuning 2
        phased = fedoras_tiny_config(kind="local", num_hosts=2)
        last = dataclasses.replace(phased.phases[-1], rounds=2)
        return dataclasses.replace(phased, rounds=7, phases=(*phased.phases[:-1], last), checkpoint=checkpoint)
    algorithm = SPECIAL.get(name) or ALGORITHM_CONFIGS[name]()
    cfg = dataclasses.replace(
        tiny_config(kind="local", num_hosts=2),
        rounds=rounds,
        model=SIDE_EXIT if name in SIDE_EXIT_METHODS else MODELS.get(name, MODEL),
        algorithm=algorithm,
        checkpoint=checkpoint,
    )
    if data is None:
        cfg = dataclasses.replace(cfg, data=SYNTHETIC)
    if name in SIDE_EXIT_METHODS:  # every client's last upload is kept (the all-device model): a resume restores them
        cfg = dataclasses.replace(cfg, eval_all_devices=True)
    links = LINKS if name in NESTED else LinkConfig()
    return dataclasses.replace(cfg, system=_budgets(cfg, data, links))


def _budgets(cfg: ExperimentConfig, data: FederatedDataset | None, links: LinkConfig) -> SystemConfig:
    oracle = build_clock(cfg, build_setup(cfg, data)).oracle
    assert oracle.family is not None and oracle.elastic is not None
    space = oracle.family.space
    quarter = space.units(SubModelSpec.uniform(space, 0.25).ratios)
    low, high = (oracle.elastic.model_cost(u)["peak_memory"] / 2.0**20 for u in (quarter, oracle.family.full_units))
    return SystemConfig(memory=ResourceConfig(source="uniform", low=low, high=1.3 * high), links=links)


def assert_same_run(
    a: Path,
    b: Path,
    a_result: RunResult | None = None,
    b_result: RunResult | None = None,
    ignore: tuple[str, ...] = (),
) -> None:
    """Two run directories hold the same records (wall-clock columns and ``ignore`` aside) and, given their results,
    the same final global state, bit for bit: parameters, optimizer state, architectures and the algorithm's own
    state (model search's pool, FedTrans's utilities, FedorAS's tiers and populations) compared by content."""
    skipped = {*WALL_CLOCK_COLUMNS, *ignore}
    for table in ("rounds", "clients", "evals", "client_accs"):
        parquet = [(d / f"{table}.parquet").exists() for d in (a, b)]
        assert parquet[0] == parquet[1], table  # client_accs.parquet: only with per-client test data
        if parquet[0]:
            x, y = (pd.read_parquet(d / f"{table}.parquet") for d in (a, b))
            x, y = (f.drop(columns=[c for c in skipped if c in f.columns]) for f in (x, y))
            pd.testing.assert_frame_equal(x, y, check_exact=True)
        xc, yc = (pd.read_csv(d / f"{table}.csv", keep_default_na=False) for d in (a, b))
        xc, yc = (f.drop(columns=[c for c in skipped if c in f.columns]) for f in (xc, yc))
        pd.testing.assert_frame_equal(xc, yc, check_exact=True)
    x_summary, y_summary = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for summary in (x_summary, y_summary):
        summary.pop("wall_time_s")
        summary.pop("name")
        summary.pop("backend")  # where it ran (a resume may change backend), not what it computed
    assert x_summary == y_summary  # phases' results included (FedorAS's search)
    # the exported models (engine/persist/export.py): the same files, metadata and tensors
    xm, ym = (exported_models(d) for d in (a, b))
    assert [(m.path.name, m.round_idx, m.accuracy, m.units) for m in xm] == [
        (m.path.name, m.round_idx, m.accuracy, m.units) for m in ym
    ]
    for p, q in zip(xm, ym, strict=True):
        xt, yt = load_file(str(p.path)), load_file(str(q.path))
        assert xt.keys() == yt.keys() and all(torch.equal(xt[n], yt[n]) for n in xt), p.path.name
    if a_result is not None and b_result is not None:
        assert_same_state(a_result.state.params, b_result.state.params)
        assert_same_state(a_result.state.opt_state, b_result.state.opt_state)
        assert a_result.state.models == b_result.state.models
        assert_same_object(a_result.state.algo_state, b_result.state.algo_state, "algo_state")


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def assert_same_object(a: object, b: object, where: str) -> None:
    """``a`` and ``b`` hold the same contents, bit for bit: the same types all the way down, arrays and tensors of the
    same dtype, shape and bytes, floats equal or both NaN; dataclasses, containers and plain objects compared field by
    field. ``where`` names the first difference (``algo_state.searches[1].seen_scores``)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert_same_object(a.detach().cpu().numpy(), b.detach().cpu().numpy(), where)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.dtype == object:
            for k, (x, y) in enumerate(zip(a.ravel(), b.ravel(), strict=True)):
                assert_same_object(x, y, f"{where}.flat[{k}]")
        else:
            assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), f"{where}: contents differ"
    elif isinstance(a, float | np.floating):
        assert a == b or (math.isnan(a) and math.isnan(b)), f"{where}: {a!r} vs {b!r}"  # type: ignore[arg-type]
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            assert_same_object(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for key in a:
            assert_same_object(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        assert len(a) == len(b), f"{where}: {len(a)} items vs {len(b)}"
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_object(x, y, f"{where}[{k}]")
    elif hasattr(a, "__dict__") and not callable(a):
        assert_same_object(vars(a), vars(b), where)
    else:  # None, bool, int, str, bytes, sets of those
        assert a == b, f"{where}: {a!r} vs {b!r}"


def assert_records_agree(run_dir: Path) -> dict[str, Any]:
    """The CSV and Parquet record files hold the same rows, and ``summary.json`` counts them; returns the summary."""
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    for table in ("rounds", "clients", "evals"):
        csv_rows = pd.read_csv(run_dir / f"{table}.csv", keep_default_na=False)
        parquet_rows = pd.read_parquet(run_dir / f"{table}.parquet")
        assert len(csv_rows) == len(parquet_rows), table
        for column in parquet_rows.columns:
            if pd.api.types.is_numeric_dtype(parquet_rows[column]):
                pd.testing.assert_series_equal(
                    csv_rows[column].astype(float), parquet_rows[column].astype(float), check_names=False
                )
            else:
                assert list(csv_rows[column].astype(str)) == list(parquet_rows[column]), (table, column)
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert summary["rounds"] == len(rounds) and list(rounds["round_idx"]) == list(range(len(rounds)))
    return summary


def keep_checkpoints_up_to(run_dir: Path, rounds_done: int) -> None:
    """Drop the checkpoints after ``rounds_done``, as if the run had stopped there (its records go on further)."""
    store = CheckpointStore(run_dir, keep=1)
    for manifest in store.manifests():
        if int(manifest.stem.removeprefix("round-")) > rounds_done:
            manifest.unlink()
            (manifest.parent / f"{manifest.stem}.safetensors").unlink()
