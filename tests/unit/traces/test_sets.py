"""Named real trace sets: fetched from a mirror laid out as their public source with each file's SHA-256 checked
(a changed file refused and not kept), found in the cache or beside the checkout, and named in configs; a set on
neither gives the command that fetches it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rayfl.cli import main
from rayfl.core.errors import ConfigError
from rayfl.experiment.loader import load_config
from rayfl.traces.format import TraceError
from rayfl.traces.sets import TRACE_SETS, fetch_trace_set, locate_trace_set, resolve_trace_path

REAL = Path(__file__).resolve().parents[4] / "shared" / "traces-real" / "mobilebandwidth-sigcomm22"
needs_copy = pytest.mark.skipif(not REAL.is_dir(), reason="the copies beside the checkout are not on this machine")


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
    monkeypatch.setattr("rayfl.traces.sets._beside_checkout", lambda name: tmp_path / "nowhere" / name)
    with pytest.raises(TraceError, match="rayfl traces fetch mahimahi-cellular"):
        locate_trace_set("mahimahi-cellular", tmp_path / "cache")
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"system\.bandwidth_down\.directory: .*rayfl traces fetch mahimahi-cellular"):
        load_config(
            None, ["system.bandwidth_down={source: trace, format: mahimahi, directory: trace-set:mahimahi-cellular}"]
        )
    with pytest.raises(TraceError, match="no trace set named"):
        resolve_trace_path("trace-set:nope")


@needs_copy
def test_a_config_names_a_set_found_beside_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path / "empty-cache"))
    cfg = load_config(
        None,
        [
            "system.bandwidth_down={source: empirical, format: mobilebandwidth, "
            "file: trace-set:mobilebandwidth-sigcomm22/wifi5.csv}"
        ],
    )
    assert cfg.system.bandwidth_down.file == str(REAL / "wifi5.csv")


@needs_copy
def test_a_flat_copy_of_the_set_serves_as_a_mirror(tmp_path: Path) -> None:
    """A folder holding the set's files side by side (as the copies beside the checkout) is a mirror too, though
    the source keeps them under data/."""
    cache = tmp_path / "cache"
    assert fetch_trace_set("mobilebandwidth-sigcomm22", cache, str(REAL)) == cache / "mobilebandwidth-sigcomm22"
    assert (cache / "mobilebandwidth-sigcomm22" / "5G.csv").read_bytes() == (REAL / "5G.csv").read_bytes()


def test_a_failed_first_fetch_leaves_no_folder_in_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(TraceError, match=r"cannot download .*empty.* or .*; with no internet, give --mirror"):
        fetch_trace_set("mobilebandwidth-sigcomm22", cache, str(tmp_path / "empty"))
    assert not (cache / "mobilebandwidth-sigcomm22").exists()
