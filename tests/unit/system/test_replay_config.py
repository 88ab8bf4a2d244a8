"""The shipped system experiment: its real trace sources load and drive a short run end to end (on the mahimahi
traces that ship with rayfl, so that a fresh clone needs neither the cache nor a network)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, DataConfig
from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from rayfl.system.resources import TraceReplay, build_source
from tests.helpers import tiny_image_dataset

REPO = Path(__file__).resolve().parents[3]
# the shipped selection of trace-set:mahimahi-cellular (6 of its 13 logs), in place of the whole set the config names
SHIPPED_LINKS = [f"system.bandwidth_{way}.directory=trace-set:mahimahi-cellular-lite" for way in ("down", "up")]


def test_default_system_experiment_replays_real_cellular_and_recorded_memory_traces() -> None:
    cfg = load_config(REPO / "experiments" / "default_system.yaml", SHIPPED_LINKS)
    down = build_source(cfg.system.bandwidth_down, "bandwidth", cfg.seed, "bandwidth_down")
    memory = build_source(cfg.system.memory, "memory", cfg.seed, "memory")
    assert isinstance(down, TraceReplay) and len(down.logs) == 3  # every *.down log of the selection
    assert isinstance(memory, TraceReplay) and len(memory.logs) == 1
    rates = down.at(np.arange(70), 100.0, 0)
    assert np.all(rates >= 0) and rates.max() > 1e6  # bit/s: cellular links reach Mbit/s
    mib = memory.at(np.arange(5), 0.0, 0) / 2**20
    assert np.all((mib > 40) & (mib < 48))  # the recording (20.5-23.6 GiB free) scaled by 0.002
    # the same sources drive a short run on small data (the model and data swapped for test-sized ones)
    small = dataclasses.replace(
        cfg,
        rounds=2,
        clients_per_round=4,
        data=DataConfig(name="synthetic"),
        model=CNNConfig(channels=(8, 16)),
        train=dataclasses.replace(cfg.train, sequence_loss="last", batch_size=5),
        backend=BackendConfig(kind="local"),
        system=dataclasses.replace(cfg.system, memory=dataclasses.replace(cfg.system.memory, scale=1.0)),
    )
    result = run_experiment(small, write=False, dataset=tiny_image_dataset())
    assert [r.clients_sampled for r in result.records] == [4, 4]
    assert all(r.sim_duration_s > 0 for r in result.records)
    assert any(np.isfinite(r.bandwidth_util) for r in result.records)
