"""Real trace sets by name, fetched on demand from their public sources with pinned checksums.

A config names a set instead of a path outside the repository: ``directory: trace-set:mahimahi-cellular`` (or
``file: trace-set:mobilebandwidth-sigcomm22/wifi5.csv`` for one file of it). The loader resolves the name to a folder
holding every file of the set: the cache (``$RAYFL_CACHE/traces/NAME``, filled by ``rayfl traces fetch NAME``), else
a copy beside the checkout (``../shared/traces-real/NAME``, where this project's tests and benchmarks find them).
Neither there: one line saying which command fetches it.

``fetch_trace_set`` downloads each file from the source's pinned commit (or from a mirror laid out the same way: a
``file://`` folder for tests and machines without internet), checks its SHA-256 before it is kept, and writes it
under a temporary name first, so a cut download or a changed file upstream never lands in the cache. The sources'
licences come with the files (GPL v3 for Mahimahi's traces, the SIGCOMM'22 data's own licence).
"""

from __future__ import annotations

import logging
import os
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rayfl.core.files import sha256_of
from rayfl.traces.format import TraceError

__all__ = ["TRACE_SETS", "TRACE_SET_PREFIX", "TraceSet", "fetch_trace_set", "locate_trace_set", "resolve_trace_path"]

log = logging.getLogger(__name__)

TRACE_SET_PREFIX = "trace-set:"


@dataclass(frozen=True)
class TraceSet:
    """A published set: where its files are (``base_url`` + each file's remote path) and their SHA-256."""

    name: str
    base_url: str
    files: dict[str, str] = field(default_factory=dict)  # local name -> SHA-256
    remote: dict[str, str] = field(default_factory=dict)  # local name -> path under base_url (default: the name)
    about: str = ""

    def remote_path(self, name: str) -> str:
        return self.remote.get(name, name)


_MAHIMAHI = "https://raw.githubusercontent.com/ravinet/mahimahi/ae477d437615b972217498ba52be07db17a15618/"
_MAHIMAHI_FILES = {
    "ATT-LTE-driving-2016.down": "24a40538340de991e0a6595aefc381b11a3da0446176e69b51750707a57b0344",
    "ATT-LTE-driving-2016.up": "ebb3d53674b77be4ed920ad91c4513a496e04e30da839e2ca8a627cb7269071e",
    "ATT-LTE-driving.down": "73c58f41bf7a3f0fac82810ca61307521be1cf6b77a0e98093fd340bddfd161f",
    "ATT-LTE-driving.up": "d58a640b9bccd131a421bff6eaf727aba324d9258b35009655bbf68e087b9b29",
    "TMobile-LTE-driving.down": "d48ff134fc29c36cc3c3dee203464246bd698f0faede42534a27b0cbe3057055",
    "TMobile-LTE-short.down": "4f33dce8dd811b5702272af64aaf64d3913719919abd776edf1e0f7c0965da43",
    "TMobile-LTE-short.up": "1c0d1bf5417b07597724fd64afe676af3c1f337a4ccdde90106bf96b1bcf18b2",
    "TMobile-UMTS-driving.down": "c97a74e7e6cf593d93b59f73db614bc6186bef510531636ad9961a3b9fc18024",
    "TMobile-UMTS-driving.up": "f2dc7c8e57f4cf525fefaff2d68c18a9118fd1382ce9c240b1d324a2a60f8a65",
    "Verizon-EVDO-driving.down": "60c9cd7b5d8be7d89d3807052a043f54787958f04cfd4c6c16fcdac6e2c3b9da",
    "Verizon-EVDO-driving.up": "6055d60d234030035f59475dc1d39d99e7c2817b9fa5d485f1f0710b1aae2075",
    "Verizon-LTE-short.down": "c918436fbd6246af134c76585d9395881fdd27203c59a8902b9a7c675b8a8e3e",
    "Verizon-LTE-short.up": "f6cd9049f58d70f12545772a3482ded085b6d50f06a2f4ff4afcfb6fe7976dcc",
}
_MOBILEBANDWIDTH = "https://raw.githubusercontent.com/mobilebandwidth/mobilebandwidth.github.io/ac6aed5d8fd7c20f776b4fe8c848b79966cf773f/"
_MOBILEBANDWIDTH_FILES = {
    "4G.csv": "e01057781199852215959e2a79748d5fa3b2184fc168d41c5a76341a88932556",
    "5G.csv": "cbfa3ab3ac14ec3b883d3a0a71108b4b78e6eb323e4673192e00afb22818082f",
    "wifi4.csv": "f9490311019386beea1228f299152d88af66b7c7c43b607ae71911429c5d0c9d",
    "wifi5.csv": "3b2f17cd5acf47f329e14e67a805de369279b5f6afea75b4fa7798f433643335",
    "wifi6.csv": "597227a30377fd71a2a1a8f334a2a3f2daa346f7a65f76fc77d335d0be1ba1dc",
}

TRACE_SETS: dict[str, TraceSet] = {
    "mahimahi-cellular": TraceSet(
        "mahimahi-cellular",
        _MAHIMAHI,
        {**_MAHIMAHI_FILES, "COPYING": "8ceb4b9ee5adedde47b31e975c1d90c73ad27b6b165a1dcd80c7c545eb65b903"},
        {name: f"traces/{name}" for name in _MAHIMAHI_FILES},
        "13 US cellular link traces (LTE/UMTS/EVDO, down and up) shipped with Mahimahi; format: mahimahi",
    ),
    "mobilebandwidth-sigcomm22": TraceSet(
        "mobilebandwidth-sigcomm22",
        _MOBILEBANDWIDTH,
        {**_MOBILEBANDWIDTH_FILES, "LICENSE.txt": "1b2961567cb762692cc23af8f6675f09fc808c3adda33d32de9d41aa7102a1c8"},
        {name: f"data/{name}" for name in _MOBILEBANDWIDTH_FILES},
        "50,000 phone bandwidth tests (4G, 5G, Wi-Fi 4/5/6), SIGCOMM'22; format: mobilebandwidth (a distribution)",
    ),
}


def _cache_root(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return cache_dir
    env = os.environ.get("RAYFL_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "rayfl") / "traces"


def _beside_checkout(name: str) -> Path:
    """Where this project keeps its copies: ``shared/traces-real`` next to the repository's folder."""
    return Path(__file__).resolve().parents[3] / "shared" / "traces-real" / name


def _trace_set(name: str) -> TraceSet:
    found = TRACE_SETS.get(name)
    if found is None:
        raise TraceError(f"no trace set named {name!r}: the sets are {', '.join(sorted(TRACE_SETS))}")
    return found


def _complete(folder: Path, trace_set: TraceSet) -> bool:
    return all((folder / name).is_file() for name in trace_set.files)


def locate_trace_set(name: str, cache_dir: Path | None = None) -> Path:
    """The folder holding every file of set ``name``: the cache's, else the copy beside the checkout; a
    ``TraceError`` naming the command that fetches it when neither has it."""
    trace_set = _trace_set(name)
    cached = _cache_root(cache_dir) / name
    for folder in (cached, _beside_checkout(name)):
        if _complete(folder, trace_set):
            return folder
    raise TraceError(
        f"trace set {name!r} is not on this machine: fetch it once with: rayfl traces fetch {name} (into {cached})"
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
    returns the folder. A file whose SHA-256 differs is refused (``TraceError``) and not kept; a first fetch that
    fails leaves no empty folder behind."""
    trace_set = _trace_set(name)
    target = _cache_root(cache_dir) / name
    made = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    try:
        _fetch_files(trace_set, target, mirror)
    except TraceError:
        if made and not any(target.iterdir()):
            target.rmdir()  # a failed first fetch leaves no empty folder in the cache
        raise
    return target


def _download(urls: list[str], partial: Path) -> str:
    """Copy the first of ``urls`` that opens into ``partial``; returns that URL (``TraceError`` when none does)."""
    errors = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as out:
                for block in iter(lambda: response.read(1 << 20), b""):
                    out.write(block)
            return url
        except OSError as err:
            partial.unlink(missing_ok=True)
            errors.append(f"{url} ({err})")
    raise TraceError(f"cannot download {' or '.join(errors)}; with no internet, give --mirror FOLDER")


def _fetch_files(trace_set: TraceSet, target: Path, mirror: str | None) -> None:
    base = trace_set.base_url if mirror is None else _as_url(mirror)
    for file, expected in trace_set.files.items():
        local = target / file
        if local.is_file() and sha256_of(local) == expected:
            continue
        urls = [base + trace_set.remote_path(file)]
        if mirror is not None and trace_set.remote_path(file) != file:
            urls.append(base + file)  # a mirror may also be a flat copy of the set (as ../shared/traces-real/NAME)
        partial = target / f".{file}.part"
        url = _download(urls, partial)
        got = sha256_of(partial)
        if got != expected:
            partial.unlink()
            raise TraceError(f"{url}: SHA-256 {got} is not the pinned {expected}: not kept (a changed or cut file)")
        os.replace(partial, local)
        log.info("fetched %s", local)


def _as_url(mirror: str) -> str:
    url = Path(mirror).resolve().as_uri() if "://" not in mirror else mirror
    return url if url.endswith("/") else url + "/"
