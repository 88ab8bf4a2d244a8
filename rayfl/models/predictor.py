"""A trained model that runs on raw input: what ``rayfl.load_model`` returns.

``Predictor`` is an ``nn.Module`` holding the trained module (``.module``, the class the run built) with the export's
``InputSpec`` and ``InputEncoding``. Called like a module it is that module, so code written for a loaded ``nn.Module``
(``model(to_input(x, spec))``, ``.parameters()``, ``.to(device)``, a Hugging Face model's ``.config``) keeps working;
its ``predict`` methods take what a user has instead of what the data set stores: text for a character model, pixel
arrays for an image model, arrays or named columns for a feature-vector model. Conversion is ``to_input``'s, with the
export's vocabulary in front of it for text and its column names in front of it for columns.

Text is cut or padded to the window the model was trained on (``seq_len`` characters, the token spec's sample shape):
a longer text keeps its last ``seq_len`` characters, a shorter one is left-padded with spaces, so its last character
sits where a training window's last character sat (a causal transformer's position embedding is per position).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rayfl.models.encoding import InputEncoding
from rayfl.models.inputs import InputSpec, module_device, to_input

__all__ = ["Predictor", "RawInput"]

# A batch (or one sample) as a user holds it: text, an array or tensor, named columns (a dict or a DataFrame).
RawInput = str | Sequence[str] | np.ndarray | torch.Tensor | Sequence[Any] | Mapping[str, Any]

_LAYOUT = {"image": "[N, C, H, W] or [C, H, W]", "tokens": "[N, T] or [T] token ids", "features": "[N, F] or [F]"}


class Predictor(nn.Module):
    """A trained module with what turns raw input into its input (``rayfl.load_model``'s result).

    ``module``: the trained module, in eval mode; calling the predictor calls it. ``spec``: the input spec it was built
    for. ``encoding``: the export's vocabulary and names (``None``: an export written before rayfl recorded them).
    Attributes the predictor lacks are looked up on ``module``.

    ``predict(x)`` gives class ids ``int64 [N]``, ``predict_proba(x)`` the softmax ``float32 [N, num_classes]``;
    ``x`` is a batch or one sample: text (a ``str`` or a list of them; for a character model the class is the next
    character's id, which ``encoding.decode`` spells), token ids ``[N, T]``, images ``[N, C, H, W]`` or ``[C, H, W]``
    (``uint8`` pixels, or floats on the 0-1 scale), feature vectors ``[N, F]`` or ``[F]``, or named columns (a dict of
    column to values, or a DataFrame; extra columns are ignored) when the export names its feature columns.
    ``batch_size``: the rows one forward pass sees; a model whose batch norms keep no running statistics normalises
    with the batch's own, so its predictions depend on it, as its evaluation in the run did
    (``train.eval_batch_size``). Arguments of the wrong kind or shape are refused with one ``TypeError`` or
    ``ValueError`` naming them.
    """

    def __init__(self, module: nn.Module, spec: InputSpec, encoding: InputEncoding | None = None) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"Predictor(module, spec): module must be an nn.Module, got {type(module).__name__}")
        if not isinstance(spec, InputSpec):
            raise TypeError(f"Predictor(module, spec): spec must be the model's InputSpec, got {type(spec).__name__}")
        super().__init__()
        self.module = module
        self.spec = spec
        self.encoding = encoding

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The trained module's, under the export file's tensor names (no ``module.`` prefix)."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Into the trained module, under the export file's tensor names (``state_dict``'s)."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")  # not self._modules: this runs mid-unpickling
            if module is None:
                raise
            return getattr(module, name)

    def extra_repr(self) -> str:
        vocab = f", vocab={len(self.encoding.vocab)} characters" if self.encoding and self.encoding.vocab else ""
        return f"input_kind={self.spec.input_kind!r}, sample_shape={list(self.spec.sample_shape)}{vocab}"

    # ------------------------------------------------------------------------------------------------ the public API
    def prepare(self, x: RawInput) -> torch.Tensor:
        """``x`` (see the class) as the module's input on its device: ``to_input`` of the samples it stands for."""
        return to_input(self._samples(x, "prepare"), self.spec, module_device(self.module))

    def predict_proba(self, x: RawInput, *, batch_size: int = 256) -> np.ndarray:
        """Class probabilities ``float32 [N, num_classes]`` of ``x`` (see the class)."""
        logits = self._logits(self._samples(x, "predict_proba"), batch_size, "predict_proba")
        return torch.softmax(logits, dim=1).numpy()

    def predict(self, x: RawInput, *, batch_size: int = 256) -> np.ndarray:
        """The most probable class ``int64 [N]`` of ``x`` (see the class); for text, the next character's id."""
        return self._logits(self._samples(x, "predict"), batch_size, "predict").argmax(dim=1).numpy()

    def predict_next(self, text: str | Sequence[str], n: int = 1) -> str | list[str]:
        """The ``n`` characters a character model writes after ``text`` (a ``str``, or a list of them), each the most
        probable one after the text so far (greedy); the out-of-vocabulary class is written as ``OOV_CHAR``. Returns a
        ``str`` for a ``str``, a list for a list."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise TypeError(f"predict_next(text, n): n must be a positive int (characters to write), got {n!r}")
        texts = self._texts(text, "predict_next")
        if texts is None:
            raise TypeError(f"predict_next(text): text must be a str or a list of str, got {type(text).__name__}")
        encoding = self._vocabulary("predict_next")
        written = [""] * len(texts)
        for _ in range(n):
            ids = self._logits(self._windows(texts, encoding), len(texts), "predict_next").argmax(dim=1)
            chars = encoding.decode(ids.numpy())
            texts = [t + c for t, c in zip(texts, chars, strict=True)]
            written = [w + c for w, c in zip(written, chars, strict=True)]
        return written[0] if isinstance(text, str) else written

    # ------------------------------------------------------------------------------------------------- raw → samples
    def _samples(self, x: RawInput, caller: str) -> np.ndarray:
        """The samples ``x`` stands for, ``[N, *sample_shape]`` as the data set stores them."""
        kind = self.spec.input_kind
        texts = self._texts(x, caller)
        if texts is not None:
            if kind != "tokens":
                raise TypeError(f"{caller}(x): the model reads {kind} inputs {_LAYOUT.get(kind, '')}, not text")
            return self._windows(texts, self._vocabulary(caller))
        if isinstance(x, Mapping) or _is_frame(x):
            return self._columns(x, caller)
        samples = _array(x, caller)
        if samples.ndim == len(self.spec.sample_shape):
            samples = samples[None]  # one sample
        if kind != "tokens" and samples.shape[1:] != self.spec.sample_shape:
            raise ValueError(
                f"{caller}(x): {kind} inputs must be {_shape_text(self.spec)}, got shape {list(samples.shape)}"
            )
        if kind == "tokens":
            return self._token_ids(samples, caller)
        if kind == "image" and np.issubdtype(samples.dtype, np.integer):
            if samples.size and (samples.min() < 0 or samples.max() > 255):
                raise ValueError(f"{caller}(x): integer pixels must lie in 0-255 (floats: the 0-1 scale)")
            return samples.astype(np.uint8, copy=False)
        return samples.astype(np.float32, copy=False)

    def _texts(self, x: object, caller: str) -> list[str] | None:
        """``x`` as a list of texts, or ``None`` when it is not text."""
        if isinstance(x, str):
            return [x]
        if isinstance(x, (list, tuple)) and x and any(isinstance(t, str) for t in x):
            if not all(isinstance(t, str) for t in x):
                raise TypeError(f"{caller}(x): a list of texts must hold only str")
            return list(x)
        return None

    def _vocabulary(self, caller: str) -> InputEncoding:
        if self.spec.input_kind != "tokens":
            raise TypeError(f"{caller}: the model reads {self.spec.input_kind} inputs, not text")
        if self.encoding is None:
            raise ValueError(
                f"{caller}: this export carries no vocabulary (it was written before rayfl recorded one), so it cannot "
                "read text; re-export it with `rayfl export RUN_DIR OUT` (from the run's checkpoints) or run it again, "
                "or pass token ids [N, T]"
            )
        if not self.encoding.vocab:
            raise ValueError(
                f"{caller}: the model's data gave token ids without a character vocabulary, so it cannot read text; "
                "pass token ids [N, T]"
            )
        return self.encoding

    def _windows(self, texts: list[str], encoding: InputEncoding) -> np.ndarray:
        """The model's ``seq_len``-character windows of ``texts``: the last characters, left-padded with spaces."""
        seq_len = self.spec.sample_shape[0]
        pad = encoding.vocab.index(" ") if " " in encoding.vocab else 0
        out = np.full((len(texts), seq_len), pad, dtype=np.int64)
        for row, text in enumerate(texts):
            ids = encoding.encode(text[-seq_len:]) if seq_len else np.empty(0, dtype=np.int64)
            out[row, seq_len - len(ids) :] = ids
        return out

    def _token_ids(self, samples: np.ndarray, caller: str) -> np.ndarray:
        if not np.issubdtype(samples.dtype, np.integer) or samples.ndim != 2:
            raise TypeError(f"{caller}(x): token ids must be integers [N, T] or [T], got {samples.dtype} "
                            f"{list(samples.shape)}")  # fmt: skip
        if samples.size and (samples.min() < 0 or samples.max() >= self.spec.num_classes):
            raise ValueError(f"{caller}(x): token ids must lie in 0-{self.spec.num_classes - 1}")
        return samples.astype(np.int64, copy=False)

    def _columns(self, x: Any, caller: str) -> np.ndarray:
        """Named columns (a dict or a DataFrame) as feature vectors ``[N, F]`` in the export's column order."""
        names = self.encoding.feature_names if self.encoding is not None else ()
        if self.spec.input_kind != "features" or not names:
            raise TypeError(
                f"{caller}(x): this export names no feature columns, so it reads arrays "
                f"{_shape_text(self.spec)}, not a {type(x).__name__}"
            )
        present = set(x.keys()) if isinstance(x, Mapping) else {str(c) for c in x.columns}
        missing = [n for n in names if n not in present]
        if missing:
            raise ValueError(f"{caller}(x): columns {missing} are missing; the model reads {list(names)}")
        try:
            values = [np.asarray(x[n], dtype=np.float32).reshape(-1) for n in names]
        except (TypeError, ValueError) as err:
            raise ValueError(f"{caller}(x): the columns must hold numbers ({err})") from None
        if len({len(v) for v in values}) > 1:
            raise ValueError(f"{caller}(x): the columns hold different numbers of rows")
        return np.stack(values, axis=1)

    # -------------------------------------------------------------------------------------------------- the forward
    def _logits(self, samples: np.ndarray, batch_size: int, caller: str) -> torch.Tensor:
        """The module's logits of ``samples``, in eval mode and ``batch_size`` rows at a time, as float32 on the CPU."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise TypeError(f"{caller}(x, batch_size): batch_size must be a positive int, got {batch_size!r}")
        device = module_device(self.module)
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.inference_mode():
                parts = [
                    self.module(to_input(samples[i : i + batch_size], self.spec, device)).float().cpu()
                    for i in range(0, len(samples), batch_size)
                ]
        finally:
            self.module.train(was_training)
        if not parts:
            return torch.empty((0, self.spec.num_classes))
        logits = torch.cat(parts)
        if logits.ndim != 2:
            raise ValueError(f"{caller}: the model returned shape {list(logits.shape)}, not logits [N, classes]")
        return logits


def _is_frame(x: object) -> bool:
    """A DataFrame (pandas, polars ...) without importing one: named columns, indexable by name."""
    return not isinstance(x, (np.ndarray, torch.Tensor)) and hasattr(x, "columns") and hasattr(x, "__getitem__")


def _array(x: object, caller: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if not isinstance(x, (np.ndarray, list, tuple)):
        raise TypeError(f"{caller}(x): x must be an array, a tensor, text or named columns, got {type(x).__name__}")
    try:
        out = np.asarray(x)
    except ValueError as err:  # ragged nested lists
        raise ValueError(f"{caller}(x): x is not a rectangular array ({err})") from None
    if not (np.issubdtype(out.dtype, np.integer) or np.issubdtype(out.dtype, np.floating) or out.dtype == np.bool_):
        raise TypeError(f"{caller}(x): x must hold numbers, got {out.dtype}")
    return out


def _shape_text(spec: InputSpec) -> str:
    shape = list(spec.sample_shape)
    return f"[N, {', '.join(str(d) for d in shape)}] or {shape}"
