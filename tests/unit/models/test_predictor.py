"""``Predictor`` and ``InputEncoding`` (``rayfl/models/predictor.py``, ``encoding.py``) on hand-made modules whose
answers are known in closed form: a "model" that names the character after the last one writes the alphabet on."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.models.encoding import OOV_CHAR, InputEncoding
from rayfl.models.inputs import InputSpec
from rayfl.models.predictor import Predictor

VOCAB = " abcdefghijklmnopqrstuvwxyz"
TOKENS = InputSpec("tokens", num_classes=len(VOCAB) + 1, sample_shape=(6,))


class _NextLetter(nn.Module):
    """Logits peaked at (last id + 1): after "c" comes "d"; after "z" (and after it) the out-of-vocabulary class."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(5.0))
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.clone())
        following = (x[:, -1] + 1).clamp(max=TOKENS.num_classes - 1)
        return self.scale * nn.functional.one_hot(following, TOKENS.num_classes).float()


def _letters(module: _NextLetter | None = None) -> Predictor:
    encoding = InputEncoding(vocab=VOCAB, oov_index=len(VOCAB))
    return Predictor(module or _NextLetter(), TOKENS, encoding).eval()


def test_text_is_windowed_encoded_and_written_on_greedily() -> None:
    letters = _NextLetter()
    model = _letters(letters)
    assert model.predict_next("abc", n=3) == "def"
    assert model.predict_next(["wxy", "hello"], n=3) == ["z" + OOV_CHAR * 2, "pqr"]
    letters.seen.clear()
    assert model.predict(["ab", "abcdefghij"]).tolist() == [VOCAB.index("c"), VOCAB.index("k")]
    (window,) = letters.seen
    assert window.tolist() == [[0, 0, 0, 0, 1, 2], [5, 6, 7, 8, 9, 10]]  # left-padded with spaces; the last 6 kept
    assert model.predict("A!").tolist() == [len(VOCAB)]  # out of the vocabulary: read as its class
    probs = model.predict_proba("abc")
    assert probs.shape == (1, TOKENS.num_classes) and probs[0].argmax() == VOCAB.index("d")


def test_the_encoding_keeps_only_what_fits_the_model() -> None:
    meta = {"vocab": VOCAB, "oov_index": len(VOCAB), "classes": ["x"] * 3, "columns": ["a", "b"]}
    assert InputEncoding.of(meta, TOKENS) == InputEncoding(vocab=VOCAB, oov_index=len(VOCAB))
    small = InputSpec("tokens", num_classes=10, sample_shape=(6,))
    assert InputEncoding.of(meta, small) == InputEncoding()  # a vocabulary the embedding cannot hold
    table = InputSpec("features", num_classes=2, sample_shape=(2,))
    meta = {"columns": ["age", "income"], "classes": ["no", "yes"], "vocab": VOCAB}
    assert InputEncoding.of(meta, table) == InputEncoding(feature_names=("age", "income"), class_names=("no", "yes"))
    one_list_column = InputSpec("features", num_classes=2, sample_shape=(5,))
    assert InputEncoding.of({"columns": ["vector"]}, one_list_column).feature_names == ()
    encoding = InputEncoding(vocab=VOCAB, oov_index=3, feature_names=("a",), class_names=("x", "y"))
    assert InputEncoding.from_json(encoding.to_json()) == encoding
    with pytest.raises(ValueError, match=r"characters 'A' are not in the model's vocabulary"):
        InputEncoding(vocab=VOCAB).encode("A b")


def test_columns_arrays_and_refusals_of_a_feature_model() -> None:
    spec = InputSpec("features", num_classes=3, sample_shape=(2,), mean=(10.0, 0.0), std=(2.0, 1.0))
    linear = nn.Linear(2, 3)
    model = Predictor(linear, spec, InputEncoding(feature_names=("a", "b"))).eval()
    rows = np.array([[12.0, 1.0], [8.0, -3.0]], dtype=np.float32)
    with torch.no_grad():
        want = linear(torch.tensor([[1.0, 1.0], [-1.0, -3.0]])).argmax(dim=1).numpy()  # normalised by hand
    assert np.array_equal(model.predict(rows), want)
    assert np.array_equal(model.predict({"b": [1.0, -3.0], "a": [12, 8]}), want)
    with pytest.raises(ValueError, match=r"^predict\(x\): features inputs must be \[N, 2\] or \[2\], got shape"):
        model.predict(np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"^predict\(x\): the columns must hold numbers"):
        model.predict({"a": ["x"], "b": [1.0]})
    with pytest.raises(TypeError, match=r"^predict\(x\): the model reads features inputs .*, not text"):
        model.predict("some text")
    with pytest.raises(TypeError, match=r"^Predictor\(module, spec\): spec must be the model's InputSpec"):
        Predictor(linear, "features")  # type: ignore[arg-type]


def test_it_is_the_module_for_code_written_for_one() -> None:
    model = _letters()
    assert model.scale is model.module.scale  # the module's attributes
    assert not model.training and not model.module.training
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    assert torch.equal(model(ids), model.module(ids))
    copied = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    restored = torch.load(buffer, weights_only=False)
    for other in (copied, restored):
        assert isinstance(other, Predictor) and other.predict_next("abc", n=2) == "de"
    model.train()
    assert model.predict("ab").tolist() == [3] and model.module.training  # eval inside predict, put back after
