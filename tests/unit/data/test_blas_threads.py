"""Data sets are built with numpy's BLAS at one thread: safe beside ``ray.init``'s forks, the same everywhere."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from rayfl.config.sections import DataConfig
from rayfl.data import build_federated_dataset
from rayfl.data.blas_threads import blas_thread_counts, one_blas_thread
from tests.unit.data.test_synthetic import TODAYS_ARRAYS, _digest


def test_one_blas_thread_sets_one_and_restores_the_count() -> None:
    before = blas_thread_counts()
    if not before:
        pytest.skip("numpy uses no OpenBLAS here")
    with one_blas_thread():
        assert blas_thread_counts() == [1] * len(before)
        with one_blas_thread():  # nested (the run's set-up around the data set's own)
            assert blas_thread_counts() == [1] * len(before)
        assert blas_thread_counts() == [1] * len(before)
    assert blas_thread_counts() == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork handlers of OpenBLAS on Linux")
def test_a_data_set_builds_while_the_main_thread_forks() -> None:
    """The synthetic labeller's matrix products run in a second thread while this one forks as ``ray.init`` does
    (``Popen`` with a ``preexec_fn``): with OpenBLAS at two threads a product in flight during a fork never returns
    (the build hung for good in 3 of 4 tries without the fix), at one it does."""
    built: list[int] = []
    cfg = DataConfig(name="synthetic", num_clients=64, synthetic_samples=128)  # one labelled chunk and the test set
    worker = threading.Thread(target=lambda: built.append(build_federated_dataset(cfg, 0).num_clients), daemon=True)
    worker.start()
    deadline = time.monotonic() + 120
    while worker.is_alive() and time.monotonic() < deadline:
        subprocess.Popen(["true"], preexec_fn=lambda: None).wait()
    worker.join(1)
    assert built == [64], "the data set's build hung beside a fork"


@pytest.mark.parametrize("case", ["chunks", "dirichlet_noise"])
def test_one_thread_builds_todays_synthetic_arrays(case: str) -> None:
    """Built through ``build_federated_dataset`` (BLAS at one thread) the synthetic arrays still match the digests
    pinned when the labeller ran at the machine's thread count: matrix products do not split the summed dimension."""
    kwargs, seed, expected = TODAYS_ARRAYS[case]
    ds = build_federated_dataset(DataConfig(name="synthetic", **kwargs), seed)
    assert _digest(np.asarray(ds.x), ds.y, ds.offsets, ds.x_test, ds.y_test) == expected
