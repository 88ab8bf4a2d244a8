"""Small file helpers shared by the layers that fetch files (data archives, trace sets) or write runs."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

__all__ = ["child_uri", "is_storage_uri", "sha256_of"]

# ``scheme://...``: a storage URI (``s3://bucket/prefix``, ``gs://bucket/prefix``) rather than a local path; a
# Windows drive letter (``C:\``) has no ``//`` after its colon
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")


def is_storage_uri(text: str | Path) -> bool:
    """Whether ``text`` names storage by URI (``engine/persist/storage.py`` opens it) rather than a local path."""
    return isinstance(text, str) and _URI.match(text) is not None


def child_uri(uri: str, *names: str) -> str:
    """The URI ``names`` below ``uri``, keeping its query (``s3://b/runs?endpoint_override=h:9000`` ->
    ``s3://b/runs/sweep/trials?endpoint_override=h:9000``)."""
    base, sep, query = uri.partition("?")
    return f"{base.rstrip('/')}/{'/'.join(names)}{sep}{query}"


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path`` as hex, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
