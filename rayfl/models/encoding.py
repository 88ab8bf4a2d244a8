"""What turns raw input into a model's input beyond ``InputSpec``'s shape and normalisation: a character model's
vocabulary, the names of a feature vector's columns, the names of the classes.

A data set's loader records these facts in its ``meta`` (``rayfl/data/shakespeare.py`` and the LEAF loader:
``vocab``, ``oov_index``; the table loader: ``columns``, ``classes``; a custom factory's ``FederatedDataset`` may set
``vocab``, ``oov_index``, ``feature_names``, ``classes``). An export carries them (``rayfl/engine/persist/export.py``),
so that a model loaded from its files alone runs on new text or on named columns (``predictor.py``). Facts that do not
fit the model's input (a column list shorter than the feature vector, a vocabulary larger than the embedding) are left
out rather than carried wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfl.models.inputs import InputSpec

__all__ = ["OOV_CHAR", "InputEncoding"]

OOV_CHAR = "\ufffd"  # how the out-of-vocabulary class is written back as text (it reads back as that class)


@dataclass(frozen=True)
class InputEncoding:
    """The vocabulary and names an export carries beside its ``InputSpec``; empty fields where the data had none."""

    vocab: str = ""  # a character model's vocabulary: character i is token id i
    oov_index: int | None = None  # the token id of every character outside ``vocab`` (None: such text is refused)
    feature_names: tuple[str, ...] = ()  # a feature vector's column names, in vector order
    class_names: tuple[str, ...] = ()  # the label names, in class id order

    @staticmethod
    def of(meta: Mapping[str, object], spec: InputSpec) -> InputEncoding:
        """The facts of a data set's ``meta`` that fit a model built for ``spec``."""
        vocab, oov = "", None
        if spec.input_kind == "tokens":
            vocab = _vocab(meta.get("vocab"))
            raw_oov = meta.get("oov_index")
            oov = raw_oov if isinstance(raw_oov, int) and not isinstance(raw_oov, bool) else None
            if len(vocab) > spec.num_classes or (oov is not None and not 0 <= oov < spec.num_classes):
                vocab, oov = "", None  # ids the model cannot embed: not this model's vocabulary
        features: tuple[str, ...] = ()
        if spec.input_kind == "features" and len(spec.sample_shape) == 1:
            width = spec.sample_shape[0]
            features = _names(meta.get("feature_names"), width) or _names(meta.get("columns"), width)
        return InputEncoding(
            vocab=vocab,
            oov_index=oov if vocab else None,
            feature_names=features,
            class_names=_names(meta.get("classes"), spec.num_classes),
        )

    def to_json(self) -> dict[str, Any]:
        """The export's metadata entry (``from_json`` reads it back)."""
        return {
            "vocab": self.vocab,
            "oov_index": self.oov_index,
            "feature_names": list(self.feature_names),
            "class_names": list(self.class_names),
        }

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> InputEncoding:
        oov = raw.get("oov_index")
        return InputEncoding(
            vocab=str(raw.get("vocab") or ""),
            oov_index=int(oov) if oov is not None else None,
            feature_names=tuple(str(n) for n in raw.get("feature_names") or ()),
            class_names=tuple(str(n) for n in raw.get("class_names") or ()),
        )

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``, ``int64[len(text)]``: a character outside the vocabulary is ``oov_index`` (refused
        with one ``ValueError`` when there is none)."""
        lookup = {c: i for i, c in enumerate(self.vocab)}
        fallback = -1 if self.oov_index is None else self.oov_index
        ids = np.fromiter((lookup.get(c, fallback) for c in text), dtype=np.int64, count=len(text))
        if self.oov_index is None and (ids < 0).any():
            unknown = sorted({c for c in text if c not in lookup})
            raise ValueError(f"characters {''.join(unknown)!r} are not in the model's vocabulary {self.vocab!r}")
        return ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The characters of token ids; the out-of-vocabulary class (and any id past the vocabulary) is ``OOV_CHAR``."""
        return "".join(self.vocab[i] if 0 <= i < len(self.vocab) else OOV_CHAR for i in np.asarray(ids).tolist())


def _vocab(raw: object) -> str:
    """A vocabulary as loaders write it: a string of distinct characters, or a list of one-character strings."""
    if isinstance(raw, (list, tuple)) and all(isinstance(c, str) and len(c) == 1 for c in raw):
        raw = "".join(raw)
    if isinstance(raw, str) and len(set(raw)) == len(raw):
        return raw
    return ""


def _names(raw: object, count: int) -> tuple[str, ...]:
    """``raw`` as ``count`` distinct names, or none when it is not that."""
    if not isinstance(raw, (list, tuple)) or len(raw) != count or not all(isinstance(n, str) for n in raw):
        return ()
    return tuple(raw) if len(set(raw)) == count else ()
