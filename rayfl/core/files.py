"""Small file helpers shared by the layers that fetch files (data archives, trace sets)."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["sha256_of"]


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path`` as hex, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
