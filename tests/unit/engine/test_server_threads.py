"""A run's records do not depend on the thread count of the process that runs it: the driver's own torch work (here
HeteroFL's distillation and static BN) runs at ``backend.server_threads``, and the caller's setting comes back."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from rayfl.engine.driver import run_experiment
from tests.resume_cases import assert_same_run, case


def test_records_are_the_same_whatever_the_callers_thread_count(tmp_path: Path) -> None:
    cfg = dataclasses.replace(case("heterofl", None, rounds=3), output_dir=str(tmp_path))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run_experiment(dataclasses.replace(cfg, name="one-thread"))
        assert torch.get_num_threads() == 1
        torch.set_num_threads(4)  # more threads than this machine's cores: sums split differently if they were used
        four = run_experiment(dataclasses.replace(cfg, name="four-threads"))
        assert torch.get_num_threads() == 4  # restored after the run
    finally:
        torch.set_num_threads(before)
    assert one.run_dir is not None and four.run_dir is not None
    assert_same_run(one.run_dir, four.run_dir, one, four)
