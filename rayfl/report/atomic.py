"""Report files are replaced, never written through: a ``report.md`` or PNG that is a symlink is swapped for a
regular file (the link's target stays untouched), and a crash mid-write leaves the previous file whole.

Each file is written to a temporary name in its own folder and renamed over the destination (``os.replace`` renames
the link itself, not what it points to).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["replace_file", "replace_text"]


def replace_file(path: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write`` on a fresh temporary path beside ``path``, then rename it to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a report is meant to be read
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def replace_text(path: Path, text: str) -> Path:
    """``replace_file`` for UTF-8 text."""

    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    return replace_file(path, write)
