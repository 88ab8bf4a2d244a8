"""Named real trace sets: the shipped ones found in the package with an empty cache and no network; the others
fetched from a mirror laid out as their public source with each file's SHA-256 checked (a changed file refused and
not kept, every missing file named in one message), found in the cache, and named in configs; a set on no machine
path gives the command that fetches it."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path, PurePosixPath

import numpy as np
import pytest

from rayfl.cli import main
from rayfl.core.errors import ConfigError
from rayfl.core.files import sha256_of
from rayfl.experiment.loader import load_config
from rayfl.system.resources import TraceReplay, build_source
from rayfl.traces.format import TraceError
from rayfl.traces.importers import import_mahimahi
from rayfl.traces.sets import SHIPPED_ROOT, TRACE_SETS, fetch_trace_set, locate_trace_set, resolve_trace_path
from tests.unit.traces.helpers import REAL_TRACES, REPO_ROOT

REAL = REAL_TRACES / "mobilebandwidth-sigcomm22"
needs_copy = pytest.mark.skipif(not REAL.is_dir(), reason="the copies beside the checkout are not on this machine")
SHIPPED_SETS = [name for name, trace_set in TRACE_SETS.items() if trace_set.shipped]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a connection fails the test: a shipped set must need none."""

    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail(f"a network connection was attempted: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _mirror(tmp_path: Path) -> Path:
    """The source's layout (data/*.csv, LICENSE.txt at the top) built from the copies beside the checkout."""
    mirror = tmp_path / "mirror"
    trace_set = TRACE_SETS["mobilebandwidth-sigcomm22"]
    for name in trace_set.files:
        target = mirror / trace_set.remote_path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REAL / name, target)
    return mirror


@needs_copy
def test_fetch_from_a_mirror_checks_every_file_and_refuses_a_changed_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mirror, cache = _mirror(tmp_path), tmp_path / "cache"
    assert (
        main(["traces", "fetch", "mobilebandwidth-sigcomm22", "--mirror", str(mirror), "--cache-dir", str(cache)]) == 0
    )
    assert "ready" in capsys.readouterr().out
    assert locate_trace_set("mobilebandwidth-sigcomm22", cache) == cache / "mobilebandwidth-sigcomm22"
    assert (cache / "mobilebandwidth-sigcomm22" / "wifi5.csv").read_bytes() == (REAL / "wifi5.csv").read_bytes()
    # one byte changed at the source: refused, and nothing of it kept in a fresh cache
    changed = mirror / "data" / "5G.csv"
    changed.write_bytes(changed.read_bytes().replace(b"1", b"2", 1))
    fresh = tmp_path / "fresh"
    with pytest.raises(TraceError, match="is not the pinned"):
        fetch_trace_set("mobilebandwidth-sigcomm22", fresh, str(mirror))
    assert not (fresh / "mobilebandwidth-sigcomm22" / "5G.csv").exists()
    assert not list((fresh / "mobilebandwidth-sigcomm22").glob(".*.part"))
    assert (
        main(["traces", "fetch", "mobilebandwidth-sigcomm22", "--mirror", str(mirror), "--cache-dir", str(fresh)]) == 2
    )
    assert "is not the pinned" in capsys.readouterr().err


def test_a_set_on_no_machine_path_names_the_fetch_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TraceError, match="rayfl traces fetch mahimahi-cellular") as caught:
        locate_trace_set("mahimahi-cellular", tmp_path / "cache")
    assert "offline, trace-set:mahimahi-cellular-lite ships 6 of its files with rayfl" in str(caught.value)
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"system\.bandwidth_down\.directory: .*rayfl traces fetch mahimahi-cellular"):
        load_config(
            None, ["system.bandwidth_down={source: trace, format: mahimahi, directory: trace-set:mahimahi-cellular}"]
        )
    with pytest.raises(TraceError, match="no trace set named"):
        resolve_trace_path("trace-set:nope")


@needs_copy
def test_a_flat_copy_of_the_set_serves_as_a_mirror_and_a_config_finds_it_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder holding the set's files side by side (as the copies beside the checkout) is a mirror too, though
    the source keeps them under data/; a config naming the set then reads the cache's copy."""
    cache = tmp_path / "traces"
    assert fetch_trace_set("mobilebandwidth-sigcomm22", cache, str(REAL)) == cache / "mobilebandwidth-sigcomm22"
    assert (cache / "mobilebandwidth-sigcomm22" / "5G.csv").read_bytes() == (REAL / "5G.csv").read_bytes()
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path))
    cfg = load_config(
        None,
        [
            "system.bandwidth_down={source: empirical, format: mobilebandwidth, "
            "file: trace-set:mobilebandwidth-sigcomm22/wifi5.csv}"
        ],
    )
    assert cfg.system.bandwidth_down.file == str(cache / "mobilebandwidth-sigcomm22" / "wifi5.csv")


def test_fetch_from_a_mirror_names_every_missing_file_in_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty mirror: one line naming all 14 files of the set, the licence among them, and nothing copied. A
    mirror holding the shipped lite selection (flat): the line names exactly the 7 files it lacks."""
    trace_set, cache, mirror = TRACE_SETS["mahimahi-cellular"], tmp_path / "cache", tmp_path / "mirror"
    mirror.mkdir()
    args = ["traces", "fetch", "mahimahi-cellular", "--mirror", str(mirror), "--cache-dir", str(cache)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"mirror {mirror} lacks 14 of the 14 files of trace set 'mahimahi-cellular'" in err
    for file in trace_set.files:
        assert trace_set.remote_path(file) in err
    assert "COPYING (the licence, kept with the files)" in err
    assert not cache.exists()

    lite = SHIPPED_ROOT / "mahimahi-cellular-lite"
    for file in TRACE_SETS["mahimahi-cellular-lite"].files:
        shutil.copyfile(lite / file, mirror / file)
    assert main(args) == 2
    err = capsys.readouterr().err
    listed = err.split("'mahimahi-cellular': ")[1].split("; put each")[0].split(", ")
    assert sorted(listed) == sorted(f"traces/{f}" for f in trace_set.files if not (lite / f).exists())
    assert len(listed) == 7 and not cache.exists()


def test_fetch_without_a_connection_names_every_file_in_one_message(tmp_path: Path) -> None:
    """A source that cannot be reached (a closed port on this machine): the first failure ends the attempts, and
    the message names every file to put in a --mirror folder; no folder is left in the cache."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cache = tmp_path / "cache"
    with pytest.raises(TraceError, match=r"cannot download 6 of the 6 files .* with no internet, give --mirror") as e:
        fetch_trace_set("mobilebandwidth-sigcomm22", cache, f"http://127.0.0.1:{port}/")
    trace_set = TRACE_SETS["mobilebandwidth-sigcomm22"]
    assert all(trace_set.remote_path(f) in str(e.value) for f in trace_set.files)
    assert "LICENSE.txt (the licence, kept with the files)" in str(e.value)
    assert not (cache / "mobilebandwidth-sigcomm22").exists()


@pytest.mark.parametrize("name", SHIPPED_SETS)
def test_a_shipped_set_is_whole_pinned_licensed_and_in_the_wheel(name: str) -> None:
    """Every file of a shipped set is in the package with its pinned SHA-256, the licence among them, beside a
    SOURCE.md; pyproject's package data takes every file of the folder into the wheel."""
    trace_set, folder = TRACE_SETS[name], SHIPPED_ROOT / name
    assert trace_set.licence in trace_set.files and (folder / "SOURCE.md").is_file()
    for file, sha in trace_set.files.items():
        assert sha256_of(folder / file) == sha, file
    assert {p.name for p in folder.iterdir()} == {*trace_set.files, "SOURCE.md"}
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on, as in CI
    globs = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["rayfl"]
    package = SHIPPED_ROOT.parents[1]
    for path in folder.iterdir():
        assert any(PurePosixPath(path.relative_to(package).as_posix()).match(g) for g in globs), path


def test_a_shipped_set_replays_with_an_empty_cache_and_no_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_network: None
) -> None:
    """A config naming the shipped mahimahi selection loads and replays with the cache an empty folder: each
    client's bandwidth is its log's value (round robin over the sorted .down logs, from t = 0), and the cache stays
    empty. ``rayfl traces fetch`` of a shipped set has nothing to do."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("RAYFL_CACHE", str(cache))
    cfg = load_config(
        None,
        [
            "system.bandwidth_down={source: trace, format: mahimahi, pattern: '*.down', offset: zero, "
            "directory: trace-set:mahimahi-cellular-lite}"
        ],
    )
    folder = SHIPPED_ROOT / "mahimahi-cellular-lite"
    assert cfg.system.bandwidth_down.directory == str(folder)
    source = build_source(cfg.system.bandwidth_down, "bandwidth", 0, "bandwidth_down")
    assert isinstance(source, TraceReplay)
    names = ["ATT-LTE-driving-2016.down", "Verizon-EVDO-driving.down", "Verizon-LTE-short.down"]
    assert [log.name for log in source.logs] == names
    imported = [import_mahimahi(folder / name).to_si() for name in names]
    clients = np.arange(6)
    for t_s, step in ((0.5, 0), (60.5, 60)):
        np.testing.assert_array_equal(source.at(clients, t_s, 0), [imported[k % 3][step] for k in clients])
    assert imported[0].mean() / 1e6 == pytest.approx(4.56, abs=0.01)  # SOURCE.md's mean rate of the AT&T down link
    assert main(["traces", "fetch", "mahimahi-cellular-lite"]) == 0
    assert f"ships with rayfl, nothing to fetch: {folder}" in capsys.readouterr().out
    assert not any(cache.iterdir())
