"""A run that cannot write its files (a full disk, a quota, a directory made read-only): one error naming the file.

Every file of a run directory is written through ``writing(path)`` (record files, Parquet twins, ``summary.json``,
``config.yaml``, checkpoints), which turns an ``OSError`` into a ``RunWriteError`` that names the file and the
system's reason, with what to do. What was half written is undone where it was written (``records.RunWriter``: a
round's rows are cut from every record file again; ``checkpoint.py``: the temporary file is removed), so the run
directory stays consistent and resumes from its last checkpoint once the disk has room (``rayfl run --resume``).
``rayfl run`` ends with that one line and exit code ``EXIT_WRITE_FAILED`` (docs/running.md, "Exit codes").
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

__all__ = ["RunWriteError", "writing"]


class RunWriteError(OSError):
    """Writing ``path`` (a file, or a storage URI: ``storage.py``) failed with ``reason`` (the system's words, e.g.
    "No space left on device")."""

    def __init__(self, path: Path | str, err: OSError) -> None:
        self.path = path
        self.reason = err.strerror or str(err)
        hint = " (free space where the run writes, then resume it)" if err.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        super().__init__(err.errno, f"cannot write {path}: {self.reason}{hint}")

    def __str__(self) -> str:
        return str(self.args[1])


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Raise a ``RunWriteError`` naming ``path`` for an ``OSError`` inside (one already named passes unchanged)."""
    try:
        yield
    except RunWriteError:
        raise
    except OSError as err:
        raise RunWriteError(path, err) from err
