"""Real trace sets by name: shipped in the package, or fetched on demand from their public sources with pinned
checksums.

A config names a set instead of a path outside the repository: ``directory: trace-set:mahimahi-cellular-lite`` (or
``file: trace-set:fcc-pensieve/trace_10730_http---www.facebook.com`` for one file of it). The loader resolves the name
to a folder holding every file of the set: the package's own copy for the sets that ship with rayfl
(``rayfl/traces/data/NAME``, see ``rayfl.traces.catalog``), needing neither the cache nor a network; for the others
the cache (``$RAYFL_CACHE/traces/NAME``, filled by ``rayfl traces fetch NAME``). A set found nowhere: one line saying
which command fetches it, and which shipped set holds part of it.

``fetch_trace_set`` downloads each file from the source's pinned commit (or from a mirror laid out the same way, or
holding the set's files side by side: a folder for machines without internet), checks its SHA-256 before it is kept,
and writes it under a temporary name first, so a cut download or a changed file upstream never lands in the cache.
What it cannot get is reported at once: a mirror folder is checked for every file before anything is copied, and a
download run names every file it could not get, the licence file included, in one message.
"""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

from rayfl.core.files import sha256_of
from rayfl.traces.catalog import SHIPPED_ROOT, TRACE_SETS, TraceSet
from rayfl.traces.format import TraceError

__all__ = [
    "SHIPPED_ROOT",
    "TRACE_SETS",
    "TRACE_SET_PREFIX",
    "TraceSet",
    "fetch_trace_set",
    "locate_trace_set",
    "resolve_trace_path",
]

log = logging.getLogger(__name__)

TRACE_SET_PREFIX = "trace-set:"


def _cache_root(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return cache_dir
    env = os.environ.get("RAYFL_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "rayfl") / "traces"


def _trace_set(name: str) -> TraceSet:
    found = TRACE_SETS.get(name)
    if found is None:
        raise TraceError(f"no trace set named {name!r}: the sets are {', '.join(sorted(TRACE_SETS))}")
    return found


def _absent(folder: Path, trace_set: TraceSet) -> list[str]:
    return [name for name in trace_set.files if not (folder / name).is_file()]


def _listed(trace_set: TraceSet, files: list[str]) -> str:
    """The files as the source lays them out, the licence file marked (it goes with every copy)."""
    return ", ".join(
        trace_set.remote_path(f) + (" (the licence, kept with the files)" if f == trace_set.licence else "")
        for f in files
    )


def locate_trace_set(name: str, cache_dir: Path | None = None) -> Path:
    """The folder holding every file of set ``name``: the package's for a shipped set, else the cache's; a
    ``TraceError`` naming the command that fetches it (and any shipped selection of it) when it is not there."""
    trace_set = _trace_set(name)
    if trace_set.shipped:
        folder = SHIPPED_ROOT / name
        absent = _absent(folder, trace_set)
        if absent:  # an install that lost its package data, or a checkout missing committed files
            raise TraceError(
                f"trace set {name!r} ships with rayfl, but {folder} lacks {', '.join(absent)}: reinstall rayfl"
            )
        return folder
    cached = _cache_root(cache_dir) / name
    if not _absent(cached, trace_set):
        return cached
    shipped_parts = "".join(
        f"; offline, trace-set:{part.name} ships {len(part.files) - 1} of its files with rayfl"  # all but the licence
        for part in TRACE_SETS.values()
        if part.subset_of == name
    )
    raise TraceError(
        f"trace set {name!r} is not on this machine: fetch it once with: rayfl traces fetch {name} (into {cached})"
        + shipped_parts
    )


def resolve_trace_path(text: str, cache_dir: Path | None = None) -> Path:
    """``trace-set:NAME`` (the set's folder) or ``trace-set:NAME/FILE`` (one file of it) as a local path."""
    name, _, inner = text.removeprefix(TRACE_SET_PREFIX).partition("/")
    folder = locate_trace_set(name, cache_dir)
    if inner and inner not in _trace_set(name).files:
        raise TraceError(
            f"trace set {name!r} has no file {inner!r}: it has {', '.join(sorted(_trace_set(name).files))}"
        )
    return folder / inner if inner else folder


def fetch_trace_set(name: str, cache_dir: Path | None = None, mirror: str | None = None) -> Path:
    """Download set ``name`` into the cache (files already there with the right SHA-256 are kept) from its pinned
    source, or from ``mirror`` (a URL or folder laid out as the source is, or holding the set's files side by side);
    returns the folder. A shipped set needs nothing: its package folder is returned. A mirror folder lacking files
    is refused before anything is copied, naming all of them; files that cannot be downloaded are named together at
    the end. A file whose SHA-256 differs is refused (``TraceError``) and not kept; a first fetch that fails leaves no
    empty folder behind."""
    trace_set = _trace_set(name)
    if trace_set.shipped:
        return locate_trace_set(name)
    target = _cache_root(cache_dir) / name
    needed = [f for f, sha in trace_set.files.items() if not ((target / f).is_file() and sha256_of(target / f) == sha)]
    base = trace_set.base_url if mirror is None else _as_url(mirror)
    folder = _mirror_folder(mirror)
    if folder is None:
        urls = {f: [base + c for c in _candidates(trace_set, f)] for f in needed}
    else:
        urls = _mirror_urls(trace_set, needed, folder, base)
    made = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    try:
        _fetch_files(trace_set, urls, target, base)
    except TraceError:
        if made and not any(target.iterdir()):
            target.rmdir()  # a failed first fetch leaves no empty folder in the cache
        raise
    return target


def _mirror_folder(mirror: str | None) -> Path | None:
    """The local folder a mirror names (a path or a ``file://`` URL); None for the source or a remote mirror."""
    if mirror is None or ("://" in mirror and not mirror.startswith("file://")):
        return None
    return Path(urllib.request.url2pathname(mirror.removeprefix("file://"))) if "://" in mirror else Path(mirror)


def _candidates(trace_set: TraceSet, file: str) -> list[str]:
    """Where a mirror may hold ``file``: at its path in the source's layout, else beside the other files."""
    remote = trace_set.remote_path(file)
    return [remote] if remote == file else [remote, file]


def _mirror_urls(trace_set: TraceSet, needed: list[str], folder: Path, base: str) -> dict[str, list[str]]:
    """Each needed file's URL in a mirror folder; a ``TraceError`` naming every file it lacks, before any copy."""
    found = {f: [base + c for c in _candidates(trace_set, f) if (folder / c).is_file()][:1] for f in needed}
    missing = [f for f, at in found.items() if not at]
    if missing:
        raise TraceError(
            f"mirror {folder} lacks {len(missing)} of the {len(trace_set.files)} files of trace set "
            f"{trace_set.name!r}: {_listed(trace_set, missing)}; put each at that path under the mirror (as at "
            f"{trace_set.base_url}) or all of them side by side in it"
        )
    return found


def _download(urls: list[str], partial: Path) -> str:
    """Copy the first of ``urls`` that the server has into ``partial`` and return it; else raise the last
    ``HTTPError``, or at once the ``OSError`` of a server that cannot be reached (the other URLs would not help)."""
    refused: OSError | None = None
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as out:
                for block in iter(lambda: response.read(1 << 20), b""):
                    out.write(block)
            return url
        except urllib.error.HTTPError as err:
            partial.unlink(missing_ok=True)
            refused = err
        except OSError:
            partial.unlink(missing_ok=True)
            raise
    assert refused is not None, "no URL to download"
    raise refused


def _fetch_files(trace_set: TraceSet, urls: dict[str, list[str]], target: Path, base: str) -> None:
    """Download each file from the first of its URLs that has it; the ones that fail are named together at the end,
    and after a failure to connect no further file is tried."""
    failed: list[str] = []
    first_error = ""
    reachable = True
    for file, candidates in urls.items():
        if not reachable:
            failed.append(file)  # every later file would fail the same way: none is tried
            continue
        partial = target / f".{file}.part"
        try:
            url = _download(candidates, partial)
        except urllib.error.HTTPError as err:  # the server answered: it has no such file
            failed.append(file)
            first_error = first_error or f"HTTP {err.code} for {err.url}"
            continue
        except OSError as err:  # no connection
            failed.append(file)
            first_error, reachable = first_error or str(err), False
            continue
        got = sha256_of(partial)
        if got != trace_set.files[file]:
            partial.unlink()
            raise TraceError(
                f"{url}: SHA-256 {got} is not the pinned {trace_set.files[file]}: not kept (a changed or cut file)"
            )
        os.replace(partial, target / file)
        log.info("fetched %s", target / file)
    if failed:
        raise TraceError(
            f"cannot download {len(failed)} of the {len(trace_set.files)} files of trace set {trace_set.name!r} "
            f"from {base} ({first_error}): {_listed(trace_set, failed)}; with no internet, give --mirror FOLDER "
            f"holding them, each at that path or all side by side"
        )


def _as_url(mirror: str) -> str:
    url = Path(mirror).resolve().as_uri() if "://" not in mirror else mirror
    return url if url.endswith("/") else url + "/"
