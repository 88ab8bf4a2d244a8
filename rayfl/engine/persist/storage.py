"""Storage by URI: ``output_dir`` (and a sweep's) may be ``s3://bucket/prefix`` or ``gs://bucket/prefix`` as well as a
local path or a shared mount.

A URI is opened with ``pyarrow.fs.FileSystem.from_uri``, the layer Ray Tune writes its own storage through, so one
URI reaches the same bucket from rayfl and from Tune. Where the endpoint and credentials come from is pyarrow's
business: the standard AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``,
``AWS_DEFAULT_REGION``), the instance's role, or the URI's query (``s3://bucket/runs?endpoint_override=host:9000&
scheme=http&region=us-east-1`` for MinIO or another S3-compatible server); Google Cloud Storage takes its
application-default credentials.

A run on a URI is written as a local run is, in a staging folder on the machine running it, and copied to the URI
(``RunMirror.push``) at every checkpoint and when the run ends: each file that changed since the last copy is uploaded
whole, the checkpoint manifests after every other file, so a manifest on the storage always finds the state file and
the record lengths it names. Writing the run locally first keeps one writer for every kind of storage (the record
files are appended row by row, which an object store cannot do) and keeps a local run exactly as it was, with no
extra step; the copy costs an upload of the files that changed per checkpoint. A run on a URI resumes by reading
the folder back into a new staging folder first (``RunMirror.pull``).

Every refusal is one line naming the field (``output_dir``) and the URI, with the storage's own reason, credentials
in the URI masked: a bucket that does not exist, an endpoint that does not answer, a location that refuses writes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayfl.core.errors import ConfigError
from rayfl.core.files import child_uri, is_storage_uri
from rayfl.engine.persist.write_errors import RunWriteError

__all__ = [
    "MARKER",
    "RunMirror",
    "Storage",
    "check_storage",
    "download",
    "is_manifest",
    "is_storage_uri",
    "open_storage",
    "staged_run_dir",
    "staging_path",
    "storage_reason",
]

log = logging.getLogger(__name__)

# the staging folder's own note of where it is copied to and what was copied (never uploaded)
MARKER = ".rayfl-storage.json"
_MANIFEST = re.compile(r"checkpoints/round-\d{6,}\.json")
_CREDENTIALS = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/@]*)@")
_BLOCK = 1 << 20
_PARALLEL = 8  # uploads at once: most of a small file's upload is the request's round trip


@dataclass(frozen=True)
class Storage:
    """A place on a file system given by URI: ``fs`` (a ``pyarrow.fs.FileSystem``) and ``path`` on it; ``uri`` is the
    URI as given, query included, so that ``child`` URIs open the same way on another node."""

    uri: str
    fs: Any
    path: str

    def child(self, *names: str) -> Storage:
        """The place ``names`` below this one (its URI keeps this one's query)."""
        return Storage(child_uri(self.uri, *names), self.fs, f"{self.path.rstrip('/')}/{'/'.join(names)}")

    @property
    def shown(self) -> str:
        """The URI for messages: credentials written into it (``s3://KEY:SECRET@bucket``) masked."""
        return _CREDENTIALS.sub(lambda m: f"{m.group(1)}{m.group(2).split(':', 1)[0]}:***@", self.uri)

    def exists(self) -> bool:
        from pyarrow import fs as pafs

        return bool(self.fs.get_file_info(self.path).type != pafs.FileType.NotFound)

    def read_text(self) -> str:
        with self.fs.open_input_stream(self.path) as stream:
            return bytes(stream.read()).decode("utf-8")

    def write_bytes(self, data: bytes) -> None:
        with self.fs.open_output_stream(self.path) as stream:
            stream.write(data)


def storage_reason(err: BaseException) -> str:
    """The storage's reason in a few words: pyarrow's S3 errors carry the operation, the key and a request id around
    the part that says why (``NO_SUCH_BUCKET: The specified bucket does not exist``)."""
    text = " ".join(str(err).split())
    found = re.search(r"AWS Error (\w+) during \w+ operation: (.*)", text)
    if found:
        text = f"{found.group(1)}: {found.group(2)}"
    text = re.sub(r"\s*\(Request ID: [^)]*\)", "", text)
    return text.split("; Details:")[0].strip() or type(err).__name__


def open_storage(uri: str, key: str = "output_dir") -> Storage:
    """The storage ``uri`` names; a one-line ``ConfigError`` on ``key`` when pyarrow cannot open it (an unknown
    scheme, a malformed URI, a file system pyarrow was built without)."""
    from pyarrow import fs as pafs

    opened = uri
    if uri.startswith("s3://") and "allow_delayed_open" not in uri:
        # a small file then goes up in one PutObject request instead of a multipart upload's three (a failure is
        # reported when the file is closed, which the writers here wait for)
        opened = f"{uri}{'&' if '?' in uri else '?'}allow_delayed_open=true"
    try:
        filesystem, path = pafs.FileSystem.from_uri(opened)
    except (ValueError, OSError, ImportError) as err:  # pyarrow.ArrowInvalid is a ValueError
        shown = Storage(uri, None, "").shown
        raise ConfigError(f"cannot open {shown}: {storage_reason(err)}", key) from err
    return Storage(uri, filesystem, path.rstrip("/"))


def check_storage(storage: Storage, key: str = "output_dir", file: str | None = None) -> None:
    """Write, read back and remove a small file at ``storage``: a one-line ``ConfigError`` on ``key`` when the bucket
    is missing, the endpoint does not answer or the location refuses writes. Nothing else there is touched."""
    token = secrets.token_hex(8)
    probe = storage.child(f".rayfl-probe-{token}")
    try:
        probe.write_bytes(token.encode())
        seen = probe.read_text()
    except OSError as err:
        raise ConfigError(
            f"cannot write to {storage.shown} ({storage_reason(err)}): give a bucket and prefix that exist and that "
            "this machine's credentials can write",
            key,
            file=file,
        ) from err
    try:
        storage.fs.delete_file(probe.path)
    except OSError as err:  # written but not removable: writes work, which is what a run needs
        log.warning("could not remove the probe %s: %s", probe.shown, storage_reason(err))
    if seen != token:
        raise ConfigError(f"{storage.shown} did not return what was written to it", key, file=file)


def staging_path(remote: Storage) -> Path:
    """The local staging folder of the run directory ``remote``, made fresh (empty): one path per URI on a machine,
    so that whoever knows the URI (a Tune trial, before its run starts) knows where the run is staged."""
    digest = hashlib.sha256(remote.uri.encode()).hexdigest()[:16]
    local = Path(tempfile.gettempdir()) / "rayfl-stage" / digest / (remote.path.rsplit("/", 1)[-1] or "run")
    if local.parent.exists():
        shutil.rmtree(local.parent)
    local.mkdir(parents=True)
    return local


def staged_run_dir(output_dir: str, name: str, key: str = "output_dir") -> Path:
    """A fresh run directory ``output_dir/name`` (``name-1`` ... when taken there) on the storage ``output_dir``
    names, as a local staging folder that copies itself there (``RunMirror``). The name is taken by the run's first
    copy (its ``config.yaml``), not atomically: two runs started at once under one name may pick the same one."""
    root = open_storage(output_dir, key)
    check_storage(root, key)
    for k in range(10_000):
        candidate = name if k == 0 else f"{name}-{k}"
        try:
            taken = root.child(candidate).exists()
        except OSError as err:
            raise ConfigError(f"cannot list {root.shown} ({storage_reason(err)})", key) from err
        if not taken:
            remote = root.child(candidate)
            local = staging_path(remote)
            RunMirror(local, remote).save()
            return local
    raise ConfigError(f"no free run directory under {root.shown} ({name}-1 to {name}-9999 are taken)", key)


class RunMirror:
    """A local run directory (a staging folder) and the storage it is copied to. ``push`` uploads what changed since
    the last copy; ``pull`` downloads the storage's copy. What was copied is noted in the folder's ``MARKER`` file, so
    a later writer of the same folder (a resumed run) continues from it."""

    def __init__(self, local: Path, remote: Storage, sent: dict[str, tuple[int, int]] | None = None) -> None:
        self.local = local
        self.remote = remote
        self._sent: dict[str, tuple[int, int]] = dict(sent or {})

    @classmethod
    def of(cls, local: Path) -> RunMirror | None:
        """The mirror of a staging folder, or None for a plain local run directory (no ``MARKER``)."""
        marker = local / MARKER
        if not marker.is_file():
            return None
        data = json.loads(marker.read_text(encoding="utf-8"))
        sent = {str(k): (int(v[0]), int(v[1])) for k, v in dict(data.get("sent", {})).items()}
        return cls(local, open_storage(str(data["uri"])), sent)

    @classmethod
    def staging(cls, uri: str, key: str = "output_dir") -> RunMirror:
        """A new, empty staging folder for the run directory ``uri`` (whose last part names the folder)."""
        remote = open_storage(uri, key)
        mirror = cls(staging_path(remote), remote)
        mirror.save()
        return mirror

    def save(self) -> None:
        """Note the URI and what was copied in the folder's ``MARKER`` (written whole, by rename)."""
        text = json.dumps({"uri": self.remote.uri, "sent": {k: list(v) for k, v in sorted(self._sent.items())}})
        tmp = self.local / f"{MARKER}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.local / MARKER)

    def _local_files(self, skip_dirs: frozenset[str]) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for path in self.local.rglob("*"):
            rel = path.relative_to(self.local).as_posix()
            if rel.startswith(MARKER) or rel.endswith(".tmp") or _skipped(rel, skip_dirs) or not path.is_file():
                continue
            stat = path.stat()
            found[rel] = (stat.st_size, stat.st_mtime_ns)
        return found

    def push(self, skip_dirs: frozenset[str] = frozenset()) -> None:
        """Upload every file that changed since the last push (checkpoint manifests last), then remove from the
        storage what was removed here (pruned checkpoints); files in a folder named in ``skip_dirs`` are left alone
        (a sweep's ``trials`` and ``tune``, which the trials and Tune write there themselves). A failure is a
        ``RunWriteError`` naming the URI; the staging folder keeps everything, and a later push copies what this
        one did not."""
        files = self._local_files(skip_dirs)
        changed = [rel for rel, stat in files.items() if self._sent.get(rel) != stat]
        gone = [rel for rel in self._sent if rel not in files and not _skipped(rel, skip_dirs)]

        def upload(rel: str) -> None:
            self._upload(rel)
            self._sent[rel] = files[rel]

        def delete(rel: str) -> None:
            self._delete(rel)
            del self._sent[rel]

        try:
            # each group's files in parallel (an object store answers each request after a round trip), the groups
            # in order: a manifest goes up after the files it names and comes down before them
            _each(upload, [rel for rel in changed if not is_manifest(rel)])
            _each(upload, [rel for rel in changed if is_manifest(rel)])
            _each(delete, [rel for rel in gone if is_manifest(rel)])
            _each(delete, [rel for rel in gone if not is_manifest(rel)])
        finally:
            if changed or gone:
                self.save()

    def _upload(self, rel: str) -> None:
        target = self.remote.child(rel)
        try:
            with (self.local / rel).open("rb") as src, self.remote.fs.open_output_stream(target.path) as out:
                while block := src.read(_BLOCK):
                    out.write(block)
        except OSError as err:
            raise _storage_error(target, err, self.local) from err

    def _delete(self, rel: str) -> None:
        target = self.remote.child(rel)
        try:
            self.remote.fs.delete_file(target.path)
        except FileNotFoundError:
            return  # nothing to delete: gone already (removed by hand, or by a push that failed after it)
        except OSError as err:
            raise _storage_error(target, err, self.local) from err

    def pull(self, skip_dirs: frozenset[str] = frozenset()) -> int:
        """Download the storage's copy of the run directory into the staging folder (files in a folder named in
        ``skip_dirs`` left out); returns how many files came. Pulled files count as copied."""
        pulled = download(self.remote, self.local, skip_dirs)
        for rel in pulled:
            stat = (self.local / rel).stat()
            self._sent[rel] = (stat.st_size, stat.st_mtime_ns)
        self.save()
        return len(pulled)

    def discard(self) -> None:
        """Remove the staging folder (once everything is pushed: the storage holds the run)."""
        if self.local.parent.parent.name == "rayfl-stage":  # a folder ``staging_path`` made, never another
            shutil.rmtree(self.local.parent, ignore_errors=True)


def download(remote: Storage, local: Path, skip_dirs: frozenset[str] = frozenset()) -> list[str]:
    """Copy every file under ``remote`` into ``local`` (files in a folder named in ``skip_dirs`` left out); returns
    their paths relative to both. A storage that cannot be listed is a one-line ``ConfigError``."""
    from pyarrow import fs as pafs

    selector = pafs.FileSelector(remote.path, recursive=True, allow_not_found=True)
    try:
        infos = [i for i in remote.fs.get_file_info(selector) if i.type == pafs.FileType.File]
    except OSError as err:
        raise ConfigError(f"cannot read {remote.shown} ({storage_reason(err)})", file=remote.shown) from err
    pulled = []
    for info in infos:
        rel = info.path[len(remote.path) :].lstrip("/")
        if not rel or rel.startswith((MARKER, ".rayfl-probe-")) or _skipped(rel, skip_dirs):
            continue
        target = local / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with remote.fs.open_input_stream(info.path) as src, target.open("wb") as out:
            while block := src.read(_BLOCK):
                out.write(bytes(block))
        pulled.append(rel)
    return pulled


def is_manifest(rel: str) -> bool:
    """Whether ``rel`` (relative to a run directory) is a checkpoint's manifest, which names other files."""
    return _MANIFEST.fullmatch(rel) is not None


def _each(work: Callable[[str], None], rels: list[str]) -> None:
    """``work`` on every one of ``rels``, up to ``_PARALLEL`` at once; the first error is raised once all are done."""
    if len(rels) <= 1:
        for rel in rels:
            work(rel)
        return
    with ThreadPoolExecutor(max_workers=min(_PARALLEL, len(rels))) as pool:
        for future in [pool.submit(work, rel) for rel in sorted(rels)]:
            future.result()


def _skipped(rel: str, skip_dirs: frozenset[str]) -> bool:
    return bool(skip_dirs) and not skip_dirs.isdisjoint(rel.split("/")[:-1])


def _storage_error(target: Storage, err: OSError, local: Path) -> RunWriteError:
    reason = OSError(err.errno, f"{storage_reason(err)}; the run's files stay in {local}")
    return RunWriteError(target.shown, reason)
