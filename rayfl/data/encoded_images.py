"""Images stored encoded (PNG, JPEG ...) in a table column, decoded when a client reads them.

A Hugging Face ``Image`` column is a struct of ``bytes`` and ``path``; Parquet exports of image data sets hold the same
or a plain binary column. Decoding every image at set-up would be a Python pass over the samples, so the column's bytes
are kept as they are (one ``uint8`` buffer and the row offsets into it: what the Arrow column holds) and ``take``
decodes the rows a caller asks for, as ``torchvision``'s data sets do per batch. Set-up reads the first image for the
shape and mode; when every row is a PNG, the widths and heights in the PNG headers are checked for all rows at once
(vectorised), so a data set of mixed sizes is refused before anything runs; other formats are checked as they are
decoded.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rayfl.core.errors import ConfigError
from rayfl.data.federated import LazyRows

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["EncodedImages", "encoded_images", "is_encoded"]

_PNG_MAGIC = np.frombuffer(b"\x89PNG\r\n\x1a\n", dtype=np.uint8)


def is_encoded(t: pa.DataType) -> bool:
    """A binary column, or a struct with a binary ``bytes`` field (a Hugging Face ``Image``)."""
    import pyarrow as pa

    if pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        return "bytes" in names and is_encoded(t.field(names.index("bytes")).type)
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


class EncodedImages(LazyRows):
    """``uint8 [N, C, H, W]`` images decoded from ``data[offsets[i]:offsets[i + 1]]`` when indexed (``C``: 1 for
    greyscale, 3 for colour; every image converted to the first image's mode)."""

    def __init__(self, data: np.ndarray, offsets: npt.NDArray[np.int64], shape: tuple[int, int, int], mode: str,
                 where: str = "") -> None:  # fmt: skip
        self.data, self.offsets, self.mode, self.where = data, np.asarray(offsets, dtype=np.int64), mode, where
        self.shape = (len(self.offsets) - 1, *shape)
        self.dtype = np.dtype(np.uint8)

    def __reduce__(self) -> tuple[Any, ...]:
        return (EncodedImages, (self.data, self.offsets, self.shape[1:], self.mode, self.where))

    def take(self, index: npt.NDArray[np.int64]) -> np.ndarray:
        out = np.empty((len(index), *self.shape[1:]), dtype=np.uint8)
        for k, row in enumerate(np.asarray(index, dtype=np.int64).tolist()):  # one decode per image asked for
            out[k] = self._decode(row)
        return out

    def _decode(self, row: int) -> np.ndarray:
        from PIL import Image

        raw = self.data[self.offsets[row] : self.offsets[row + 1]].tobytes()
        with Image.open(io.BytesIO(raw)) as image:
            pixels = np.asarray(image.convert(self.mode))
        pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
        if pixels.shape != self.shape[1:]:
            raise ValueError(f"{self.where}: image {row} decodes to {list(pixels.shape)}, the first to "
                             f"{list(self.shape[1:])}: every image of a data set needs one size")  # fmt: skip
        return pixels


def encoded_images(column: pa.ChunkedArray, name: str, where: str) -> EncodedImages:
    """The encoded images of ``column`` (binary, or a struct with ``bytes``), checked: no empty row, and one size."""
    import pyarrow as pa

    key = "data.input_columns"
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_struct(array.type):
        if array.null_count:
            raise ConfigError(f"column {name!r} has {array.null_count} empty image(s)", key, file=where)
        array = array.field("bytes")
    if array.null_count:
        raise ConfigError(f"column {name!r} has {array.null_count} image(s) without bytes (images stored by path are "
                          "not read: store their bytes)", key, file=where)  # fmt: skip
    if len(array) == 0:
        raise ConfigError(f"column {name!r} holds no images", key, file=where)
    offsets_buf, data_buf = array.buffers()[1], array.buffers()[2]
    kind = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(offsets_buf, dtype=kind)[array.offset : array.offset + len(array) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    shape, mode = _first(data, offsets, name, where)
    _check_png_sizes(data, offsets, shape, name, where)
    return EncodedImages(data, offsets, shape, mode, where)


def _first(data: np.ndarray, offsets: npt.NDArray[np.int64], name: str, where: str) -> tuple[tuple[int, int, int], str]:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data[offsets[0] : offsets[1]].tobytes())) as image:
            mode = "L" if image.mode in ("1", "L", "I", "I;16", "F") else "RGB"
            width, height = image.size
    except (UnidentifiedImageError, OSError) as err:
        raise ConfigError(f"column {name!r}: its first image cannot be decoded ({err})", "data.input_columns",
                          file=where) from None  # fmt: skip
    return (1 if mode == "L" else 3, height, width), mode


def _check_png_sizes(
    data: np.ndarray, offsets: npt.NDArray[np.int64], shape: tuple[int, int, int], name: str, where: str
) -> None:
    """When every row is a PNG: each one's width and height (IHDR, bytes 16-23) equal to the first's, all at once."""
    starts, sizes = offsets[:-1], np.diff(offsets)
    if sizes.min() < 24:
        return
    # [N, 24]: signature, IHDR length and type, width, height; gathered 65,536 rows at a time (bounded memory)
    head = np.concatenate([data[starts[lo : lo + 65536, None] + np.arange(24)] for lo in range(0, len(starts), 65536)])
    if not np.array_equal(head[:, :8], np.broadcast_to(_PNG_MAGIC, (len(starts), 8))):
        return
    dims = head[:, 16:24].astype(np.int64).reshape(-1, 2, 4) @ (256 ** np.arange(3, -1, -1))  # big-endian
    wrong = np.flatnonzero((dims[:, 0] != shape[2]) | (dims[:, 1] != shape[1]))
    if len(wrong):
        row = int(wrong[0])
        raise ConfigError(f"column {name!r}: image {row} is {int(dims[row, 0])}x{int(dims[row, 1])}, the first "
                          f"{shape[2]}x{shape[1]} ({len(wrong)} differ): every image needs one size",
                          "data.input_columns", file=where)  # fmt: skip
