"""LEAF's preprocessed JSON data (FEMNIST and Shakespeare), one client per LEAF user.

A LEAF data folder holds ``train/*.json`` and ``test/*.json`` (LEAF's own ``data/`` level may sit in between).
Every file is ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``.

Which task a folder holds is read off the data, so the config needs no extra key: samples that are strings
are Shakespeare (``x`` an 80-character window, ``y`` the next character, both mapped to the vocabulary of
``rayfl.data.shakespeare``: LEAF's 80 characters plus one out-of-vocabulary class); samples that are lists of
784 numbers are FEMNIST (a 28×28 grey image, ``y`` one of 62 classes).

Clients are the training users, in file-name order and then in each file's order. A user's test split is their
rows of the test files; a user without test rows gets an empty split, and test-only users are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.core.rng import derive_rng
from rayfl.data import partition
from rayfl.data.federated import FederatedDataset, from_client_arrays

__all__ = ["FEMNIST_CLASSES", "LeafTask", "detect_task", "load_leaf", "read_leaf_split"]

LeafTask = Literal["femnist", "shakespeare"]
FEMNIST_CLASSES = 62
FEMNIST_PIXELS = 28 * 28

# user -> (x rows, y rows) in the JSON's own types
UserRows = dict[str, tuple[list[Any], list[Any]]]


def _split_dirs(root: Path) -> tuple[Path, Path]:
    for base in (root, root / "data"):
        if (base / "train").is_dir():
            return base / "train", base / "test"
    raise FileNotFoundError(f"LEAF data not found: expected {root / 'train'} with *.json files (and {root / 'test'})")


def read_leaf_split(folder: Path) -> UserRows:
    """All users of one split folder, files in name order; a user spread over files has their rows joined."""
    rows: UserRows = {}
    if not folder.is_dir():
        return rows
    for path in sorted(folder.glob("*.json")):
        for user, xs, ys in _leaf_users(path):
            have_x, have_y = rows.setdefault(str(user), ([], []))
            have_x.extend(xs)
            have_y.extend(ys)
    return rows


def _leaf_users(path: Path) -> list[tuple[str, list[Any], list[Any]]]:
    """``(user, xs, ys)`` of one LEAF JSON file; a malformed file is a ``ConfigError`` naming it (and the line)."""
    redo = "fix the file or re-run LEAF's preprocessing"
    try:
        with path.open("r", encoding="utf-8") as fh:
            doc = json.load(fh)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"malformed JSON ({err.msg}, column {err.colno}); {redo}", file=str(path), line=err.lineno
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read the LEAF file ({err}); {redo}", file=str(path)) from None
    try:
        users, user_data = doc["users"], doc["user_data"]
    except (KeyError, TypeError):
        raise ConfigError(f"not a LEAF file (needs 'users' and 'user_data'); {redo}", file=str(path)) from None
    out: list[tuple[str, list[Any], list[Any]]] = []
    for user in users:
        entry = user_data.get(user) if isinstance(user_data, dict) else None
        if not isinstance(entry, dict):
            reason = f"user {user!r} is listed in 'users' but has no entry in 'user_data'; {redo}"
            raise ConfigError(reason, file=str(path))
        missing = [k for k in ("x", "y") if not isinstance(entry.get(k), list)]
        if missing:
            raise ConfigError(f"user {user!r} has no list '{missing[0]}' in 'user_data'; {redo}", file=str(path))
        xs, ys = list(entry["x"]), list(entry["y"])
        if len(xs) != len(ys):
            raise ConfigError(f"user {user!r} has {len(xs)} inputs but {len(ys)} labels; {redo}", file=str(path))
        out.append((str(user), xs, ys))
    return out


def detect_task(rows: UserRows) -> LeafTask:
    """``"shakespeare"`` when samples are strings, ``"femnist"`` when they are 784 numbers."""
    for xs, _ in rows.values():
        if not xs:
            continue
        first = xs[0]
        if isinstance(first, str):
            return "shakespeare"
        if isinstance(first, list) and len(first) == FEMNIST_PIXELS:
            return "femnist"
        kind = f"a list of {len(first)} values" if isinstance(first, list) else type(first).__name__
        raise ValueError(f"cannot tell the LEAF task from a sample that is {kind}")
    raise ValueError("LEAF training data holds no samples")


def _femnist_arrays(xs: list[Any], ys: list[Any], user: str) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    if not xs:
        return np.empty((0, 1, 28, 28), dtype=np.float32), np.empty(0, dtype=np.int64)
    try:
        x = np.asarray(xs, dtype=np.float32)
    except ValueError:
        raise ValueError(f"FEMNIST user {user!r}: samples are not all {FEMNIST_PIXELS} numbers") from None
    if x.ndim != 2 or x.shape[1] != FEMNIST_PIXELS:
        raise ValueError(f"FEMNIST user {user!r}: samples have shape {x.shape[1:]}, expected ({FEMNIST_PIXELS},)")
    y = np.asarray(ys, dtype=np.int64)
    if y.min() < 0 or y.max() >= FEMNIST_CLASSES:
        raise ValueError(f"FEMNIST user {user!r}: labels outside 0..{FEMNIST_CLASSES - 1}")
    return x.reshape(-1, 1, 28, 28), y


def _shakespeare_arrays(
    xs: list[Any], ys: list[Any], user: str, seq_len: int
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    from rayfl.data.shakespeare import encode  # the vocabulary of rayfl's own Shakespeare data

    if not xs:
        return np.empty((0, seq_len), dtype=np.uint8), np.empty(0, dtype=np.int64)
    texts = [str(s) for s in xs]
    bad = next((i for i, t in enumerate(texts) if len(t) != seq_len), None)
    if bad is not None:
        raise ValueError(f"Shakespeare user {user!r}: sample {bad} has {len(texts[bad])} characters, not {seq_len}")
    labels = [str(c) for c in ys]
    if any(len(c) != 1 for c in labels):
        raise ValueError(f"Shakespeare user {user!r}: every label must be one character")
    return encode("".join(texts)).reshape(len(texts), seq_len), encode("".join(labels)).astype(np.int64)


def load_leaf(root: Path, task: LeafTask | None, cfg: DataConfig, seed: int) -> FederatedDataset:
    """A LEAF folder as a federated data set with per-client test splits.

    ``task=None`` detects the task from the samples (see the module doc). Users with fewer than
    ``cfg.min_samples`` training samples are dropped; then ``cfg.num_clients`` of the rest are kept (``0``
    or at least as many as there are: all), a random subset from ``derive_rng(seed, "partition")`` kept in
    file order. A positive ``cfg.max_samples_per_client`` keeps a random subset of each client's training
    rows (``derive_rng(seed, "partition_cap")``); test rows are never capped.
    """
    if cfg.partition != "natural":
        raise ValueError(f"LEAF data is split by its own users; use data.partition 'natural' (got {cfg.partition!r})")
    train_dir, test_dir = _split_dirs(Path(root))
    if not test_dir.is_dir() or not any(test_dir.glob("*.json")):
        raise ConfigError(
            f"no LEAF test split: expected {test_dir}/*.json beside train/ (LEAF's preprocessing writes both); "
            "re-run it or set data.root to a complete folder",
            file=str(test_dir),
        )
    train_rows = read_leaf_split(train_dir)
    test_rows = read_leaf_split(test_dir)
    if not train_rows:
        raise FileNotFoundError(f"no LEAF users found in {train_dir}/*.json")
    try:
        detected = detect_task(train_rows)
    except ValueError as err:
        raise ConfigError(f"{err}; fix the files or re-run LEAF's preprocessing", file=str(train_dir)) from None
    if task is not None and task != detected:
        raise ValueError(f"{root} holds LEAF {detected} data, not {task}")

    users = [u for u, (xs, _) in train_rows.items() if len(xs) >= cfg.min_samples]
    if not users:
        raise ConfigError(
            f"no LEAF user in {train_dir} has at least {cfg.min_samples} samples: lower data.min_samples",
            "data.min_samples",
        )
    if 0 < cfg.num_clients < len(users):
        keep = np.sort(derive_rng(seed, "partition").choice(len(users), size=cfg.num_clients, replace=False))
        users = [users[i] for i in keep.tolist()]

    seq_len = 0
    if detected == "shakespeare":
        first = next(xs[0] for xs, _ in train_rows.values() if xs)
        seq_len = len(str(first))

    def convert(xs: list[Any], ys: list[Any], user: str) -> tuple[np.ndarray[Any, Any], npt.NDArray[np.int64]]:
        try:
            if detected == "femnist":
                return _femnist_arrays(xs, ys, user)
            return _shakespeare_arrays(xs, ys, user, seq_len)
        except ValueError as err:  # a user's samples or labels do not fit the detected task
            raise ConfigError(f"{err}; fix the files or re-run LEAF's preprocessing", file=str(root)) from None

    train = [convert(*train_rows[u], u) for u in users]
    caps = partition.cap_per_client(
        [np.arange(len(y), dtype=np.int64) for _, y in train],
        cfg.max_samples_per_client,
        derive_rng(seed, "partition_cap"),
    )
    train = [(x[idx], y[idx]) for (x, y), idx in zip(train, caps, strict=True)]
    test = [convert(*test_rows.get(u, ([], [])), u) for u in users]

    meta: dict[str, object] = {"source": "leaf", "task": detected}
    if detected == "femnist":
        meta.update(mean=[0.0], std=[1.0])  # LEAF's pixels are already on the 0-1 scale; used unnormalised
        input_kind: Literal["image", "tokens"] = "image"
        num_classes = FEMNIST_CLASSES
    else:
        from rayfl.data.shakespeare import OOV_INDEX, VOCAB

        meta.update(vocab=VOCAB, oov_index=OOV_INDEX, seq_len=seq_len)
        input_kind = "tokens"
        num_classes = len(VOCAB) + 1  # as rayfl's Shakespeare data: the last class is any other character
    empty_x, empty_y = test[0][0][:0], test[0][1][:0]
    return from_client_arrays(
        detected,
        input_kind,
        num_classes,
        train,
        empty_x,
        empty_y,
        test=test,
        client_names=tuple(users),
        meta=meta,
    )
