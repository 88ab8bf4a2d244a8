"""A memory-mapped array named by its file, so that a process on another node can map the same rows from its own disk.

Ray copies an array into its object store when the array is pickled, a memory map included: a data set of ``.npy``
maps (``on_disk.py``, CIFAR-10's cache, a custom factory's) would fill the store of every node that hosts clients
with the whole file, though each node's clients read only their own rows. When every node can read the file at the
same path (shared storage such as NFS, or one copy per node), a map can travel as a ``MappedFile`` instead: the
path, where the array starts in the file, its dtype and shape, and the file's size and modification time. The
receiving process maps the file again (``open_mapped``), so its node's page cache holds the pages its clients read
and the object store holds no sample. The size and time are checked when the file is opened again: a file changed
or missing on some node stops the run in one line naming the path and the node, never with other rows.

Only read-only maps (``mmap_mode="r"``) of a contiguous block of the file qualify (``mapped_file``): a copy-on-write
map may differ from its file, and a strided view has no single block to name.
"""

from __future__ import annotations

import mmap
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rayfl.core.errors import ConfigError

__all__ = ["MappedFile", "mapped_file", "open_mapped", "this_node"]


@dataclass(frozen=True)
class MappedFile:
    """Where a read-only memory-mapped array lies: ``shape`` elements of ``dtype`` from byte ``offset`` of ``path``
    (in Fortran order when ``fortran_order``), in a file of ``size_bytes`` last modified at ``mtime_ns``."""

    path: str
    offset: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    fortran_order: bool
    size_bytes: int
    mtime_ns: int

    @property
    def nbytes(self) -> int:
        """The array's bytes (what the object store would hold)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def problem(self) -> str | None:
        """Why this node cannot map the array as it was (missing, or another size or time), or None when it can."""
        try:
            stat = os.stat(self.path)
        except OSError as err:
            return f"cannot be read ({err.strerror or err})"
        if stat.st_size != self.size_bytes or stat.st_mtime_ns != self.mtime_ns:
            return (
                f"is not the file the run started with (size {stat.st_size} bytes, modified at {stat.st_mtime_ns} "
                f"ns; the run's has {self.size_bytes} bytes, modified at {self.mtime_ns} ns)"
            )
        return None


def mapped_file(array: np.ndarray) -> MappedFile | None:
    """The file block ``array`` maps, when it is a read-only memory map of one contiguous block of a named file;
    else None (an array in memory, a copy-on-write or writable map, a strided view)."""
    if not isinstance(array, np.memmap) or getattr(array, "mode", None) != "r" or array.filename is None:
        return None
    region_map = getattr(array, "_mmap", None)  # numpy's mmap object behind the array (None once closed)
    if array.size == 0 or not (array.flags.c_contiguous or array.flags.f_contiguous) or region_map is None:
        return None
    # ``array.offset`` belongs to the map a slice came from, not to the slice: the slice's first byte is found from
    # its address in the mmap, which numpy starts at ``offset`` rounded down to the allocation granularity
    region_start = array.offset - array.offset % mmap.ALLOCATIONGRANULARITY
    region = np.frombuffer(region_map, dtype=np.uint8)
    first = int(array.__array_interface__["data"][0]) - int(region.__array_interface__["data"][0])
    stat = os.stat(array.filename)
    return MappedFile(
        path=str(array.filename),
        offset=region_start + first,
        dtype=array.dtype,
        shape=tuple(int(d) for d in array.shape),
        fortran_order=not array.flags.c_contiguous,
        size_bytes=int(stat.st_size),
        mtime_ns=int(stat.st_mtime_ns),
    )


def this_node() -> str:
    """This process's node in a message: its Ray node's address when Ray runs here, else the host name."""
    ray = sys.modules.get("ray")  # never imported here: the data layer runs without Ray
    if ray is not None and ray.is_initialized():
        return f"Ray node {ray.util.get_node_ip_address()}"
    return f"host {socket.gethostname()}"


def open_mapped(file: MappedFile) -> np.memmap:
    """``file``'s array mapped again, read-only; a one-line ``ConfigError`` naming the path and this node when the
    file is missing or not the one the run started with."""
    problem = file.problem()
    if problem is not None:
        raise ConfigError(
            f"data file {file.path} on {this_node()} {problem}; give every node that hosts clients the same file at "
            "the same path, or set data.ship: object_store",
            "data.ship",
        )
    order: Literal["C", "F"] = "F" if file.fortran_order else "C"
    return np.memmap(file.path, dtype=np.dtype(file.dtype), mode="r", offset=file.offset, shape=file.shape, order=order)
