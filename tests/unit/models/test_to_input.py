"""``rayfl.models.to_input``: stored samples to model inputs, and one clear error for arguments in the wrong order
(issue 44: a user guessed ``to_input(spec, x)`` and got ``AttributeError: 'numpy.ndarray' object has no attribute
'input_kind'``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfl.models import InputSpec, to_input


def test_images_are_scaled_and_normalised_and_tokens_become_ids() -> None:
    spec = InputSpec("image", 10, (1, 2, 2), mean=(0.5,), std=(0.25,))
    x = np.full((3, 1, 2, 2), 255, dtype=np.uint8)
    torch.testing.assert_close(to_input(x, spec), torch.full((3, 1, 2, 2), 2.0))
    tokens = to_input(np.array([[1, 2, 3]], dtype=np.int32), InputSpec("tokens", 5, (3,)))
    assert tokens.dtype == torch.int64 and tokens.tolist() == [[1, 2, 3]]


def test_arguments_in_the_wrong_order_are_one_type_error_naming_them() -> None:
    spec = InputSpec("image", 10, (1, 2, 2))
    x = np.zeros((3, 1, 2, 2), dtype=np.uint8)
    with pytest.raises(
        TypeError, match=r"spec must be the model's InputSpec .* got ndarray; the arguments are \(samples, spec"
    ):
        to_input(spec, x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"x must be an array of samples \[batch, \.\.\.\], got list"):
        to_input([[0, 1]], spec)  # type: ignore[arg-type]
