"""Per-client bandwidth drawn from measured distributions (data sets that are not time series).

- ``MobileBandwidthSampler``: the SIGCOMM 2022 mobile bandwidth tests (Yang et al.), one test per row, 4G / 5G /
  Wi-Fi 4/5/6. Draws are resampled test results, so every value drawn is one that a real phone measured.
- ``FlashSpeedSampler``: FLASH's per-device download/upload speed (mean, std) of 19 phones (Yang et al., WWW 2021),
  drawn the way FLASH draws them: pick a device, then Normal(mean, std) redrawn while negative.

Both take the random generator from the caller, so a client's bandwidth is a pure function of its derived seed.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from rayfl.traces.format import TraceError

__all__ = ["FLASH_KBPS_TO_MBPS", "FlashSpeedSampler", "MobileBandwidthSampler", "technology_key"]

# FLASH's speeds are "kb/s" used as KiB/s (it divides model bytes by 1024 before dividing by them).
FLASH_KBPS_TO_MBPS = 1024 * 8 / 1e6


def technology_key(name: str) -> str:
    """Case- and punctuation-free form of a technology name: 'Wi-Fi 6', 'WIFI6' and 'wifi6' are all 'wifi6'."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _row_technology(row: dict[str, str]) -> str:
    """4G / 5G for the cellular files; WiFi4/5/6 from ``wifi_wifiStandard`` for the Wi-Fi files.

    The Wi-Fi files hold a few rows whose ``network_type`` says 4G or 5G (under 1 %); the file (every row has its Wi-Fi
    standard) decides, since the test set was selected as Wi-Fi tests.
    """
    standard = (row.get("wifi_wifiStandard") or "").strip()
    return f"WiFi{standard}" if standard else (row.get("network_type") or "").strip()


class MobileBandwidthSampler:
    """Empirical distribution of ``bandwidth_Mbps`` from the mobilebandwidth-sigcomm22 CSVs.

    ``path`` is one CSV or a folder of them (all ``*.csv`` are read). ``technology`` keeps only rows of that access
    technology (or several): '4G', '5G', 'WiFi4', 'WiFi5', 'WiFi6', or 'WiFi' for all Wi-Fi; matching ignores case and
    punctuation. ``values_mbps``, ``technologies``, ``brands`` and ``models`` are the kept rows, in file order.
    """

    def __init__(self, path: str | os.PathLike[str], technology: str | Iterable[str] | None = None) -> None:
        root = Path(path)
        files = sorted(root.glob("*.csv")) if root.is_dir() else [root]
        if not files:
            raise TraceError(f"{root}: no *.csv files in this folder")
        bandwidth: list[float] = []
        techs: list[str] = []
        brands: list[str] = []
        models: list[str] = []
        for file in files:
            for row, value in _read_bandwidth_rows(file):
                bandwidth.append(value)
                techs.append(_row_technology(row))
                brands.append(row.get("brand", ""))
                models.append(row.get("model", ""))
        keep = np.ones(len(bandwidth), dtype=bool)
        if technology is not None:
            wanted = {technology_key(t) for t in ([technology] if isinstance(technology, str) else technology)}
            keys = [technology_key(t) for t in techs]
            keep = np.array([k in wanted or ("wifi" in wanted and k.startswith("wifi")) for k in keys], dtype=bool)
            if not keep.any():
                present = ", ".join(sorted(set(techs)))
                raise TraceError(f"{root}: no rows of technology {technology!r} (present: {present})")
        self.path = root
        self.technology = technology
        self.values_mbps: np.ndarray = np.asarray(bandwidth, dtype=np.float64)[keep]
        self.technologies: np.ndarray = np.asarray(techs, dtype=object)[keep]
        self.brands: np.ndarray = np.asarray(brands, dtype=object)[keep]
        self.models: np.ndarray = np.asarray(models, dtype=object)[keep]
        self.values_mbps.setflags(write=False)
        if self.values_mbps.size == 0:
            raise TraceError(f"{root}: no bandwidth tests found")

    def __len__(self) -> int:
        return int(self.values_mbps.size)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` per-client bandwidths in Mbit/s, drawn with replacement from the measured tests."""
        return rng.choice(self.values_mbps, size=n, replace=True)


def _read_bandwidth_rows(file: Path) -> Iterable[tuple[dict[str, str], float]]:
    try:
        with open(file, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or "bandwidth_Mbps" not in reader.fieldnames:
                raise TraceError(f"{file}:1: missing header column 'bandwidth_Mbps' (is this a mobilebandwidth CSV?)")
            for row in reader:
                where = f"{file}:{reader.line_num}"
                text = (row.get("bandwidth_Mbps") or "").strip()
                try:
                    value = float(text)
                except ValueError:
                    raise TraceError(f"{where}: bad number for bandwidth_Mbps: {text!r}") from None
                if not math.isfinite(value) or value < 0:
                    raise TraceError(f"{where}: bandwidth_Mbps must be finite and >= 0, got {text!r}")
                yield row, value
    except UnicodeDecodeError as err:
        raise TraceError(f"{file}: not UTF-8 text ({err.reason} at byte {err.start})") from err


class FlashSpeedSampler:
    """FLASH's ``speed_distri.json``: per device, mean and std of download and upload speed in KiB/s.

    ``devices`` maps a device id to ``(down_mean, down_std, up_mean, up_std)`` in Mbit/s.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise TraceError(f"{self.path}:{err.lineno}: bad JSON: {err.msg}") from None
        if not isinstance(raw, dict) or not raw:
            raise TraceError(f"{self.path}: expected a non-empty JSON object of devices")
        devices: dict[str, tuple[float, float, float, float]] = {}
        for guid, entry in raw.items():
            try:
                numbers = tuple(
                    float(entry[k]) * FLASH_KBPS_TO_MBPS for k in ("down_u", "down_sigma", "up_u", "up_sigma")
                )
            except (KeyError, TypeError, ValueError):
                raise TraceError(
                    f"{self.path}: device {guid!r} needs numbers down_u, down_sigma, up_u, up_sigma"
                ) from None
            if not all(math.isfinite(x) and x >= 0 for x in numbers) or numbers[0] <= 0 or numbers[2] <= 0:
                raise TraceError(f"{self.path}: device {guid!r} has a non-positive mean or a negative std")
            devices[str(guid)] = (numbers[0], numbers[1], numbers[2], numbers[3])
        self.devices = devices
        self._table = np.asarray(list(devices.values()), dtype=np.float64)

    def __len__(self) -> int:
        return len(self.devices)

    def sample(self, rng: np.random.Generator, n: int, direction: str = "down") -> np.ndarray:
        """``n`` speeds in Mbit/s: a device drawn uniformly per client, then Normal(mean, std) redrawn while < 0."""
        if direction not in ("down", "up"):
            raise TraceError(f"direction must be 'down' or 'up', got {direction!r}")
        col = 0 if direction == "down" else 2
        device = rng.integers(len(self._table), size=n)
        mean, std = self._table[device, col], self._table[device, col + 1]
        out: np.ndarray = rng.normal(mean, std)
        for _ in range(1000):  # means are positive, so each redraw keeps at least about half of what is left
            bad = out < 0
            if not bad.any():
                return out
            out[bad] = rng.normal(mean[bad], std[bad])
        raise TraceError("could not draw non-negative speeds in 1000 tries")  # pragma: no cover
