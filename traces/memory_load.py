"""The load that ran while ``host-sawtooth.memory.csv`` was recorded: allocate, hold, free, repeat.

Each 30 s cycle allocates ``--steps`` blocks of ``--step-mib`` MiB at seconds 0, 1, ..., 11 of the cycle (numpy
arrays filled with ones, so every page is touched and counts as used), holds them until second 18, frees them all at
once and idles until second 30. Times are on an absolute schedule from the start. With the defaults the process's
memory ramps from 0 to 3 GiB and back six times in three minutes.

    python traces/memory_load.py --duration 185 &
    rayfl traces record traces/host-sawtooth --interval 1 --duration 180 --kinds memory --note "..."
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=185.0, help="seconds to run (default 185)")
    parser.add_argument("--step-mib", type=int, default=256, help="MiB allocated each second of a ramp (default 256)")
    parser.add_argument("--steps", type=int, default=12, help="allocations per ramp (default 12)")
    parser.add_argument("--hold-s", type=float, default=6.0, help="seconds the full ramp is held (default 6)")
    parser.add_argument("--idle-s", type=float, default=12.0, help="seconds idle after freeing (default 12)")
    args = parser.parse_args()
    period_s = args.steps + args.hold_s + args.idle_s
    start = time.monotonic()
    blocks: list[np.ndarray] = []

    def wait_until(offset_s: float) -> None:  # on an absolute schedule, so allocation time does not stretch a cycle
        time.sleep(max(0.0, start + offset_s - time.monotonic()))

    events: list[tuple[float, str]] = []
    for cycle in range(math.ceil(args.duration / period_s)):
        t0 = cycle * period_s
        events += [(t0 + k, "allocate") for k in range(args.steps)] + [(t0 + args.steps + args.hold_s, "free")]
    for at_s, action in events:
        if at_s >= args.duration:
            break
        wait_until(at_s)
        if action == "allocate":
            blocks.append(np.ones(args.step_mib * 2**20 // 8, dtype=np.float64))
        else:
            blocks.clear()
    wait_until(args.duration)


if __name__ == "__main__":
    main()
