"""Digests of the deterministic part of shipped experiments' records, to check that engine work changes no result.

Each config is run shortened (``--overrides``, default ``rounds=2``) in this process and reduced to one digest per
record kind: every ``RoundRecord`` field except the wall-clock ones, every ``ClientRecord`` and ``EvalRecord``, the
final global parameters (bytes) and the trivial baseline. Run it before and after a change and compare the JSON::

    python benchmarks/records_digest.py experiments/paper/cpu/*.yaml experiments/fedhen/*.yaml --out before.json
    ... change ...
    python benchmarks/records_digest.py experiments/paper/cpu/*.yaml experiments/fedhen/*.yaml --compare before.json

Configs whose data cannot be loaded here (CIFAR-10, Shakespeare without network) are reported as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rayfl.engine.persist.records import HOST_CLOCK_FIELDS

# host-clock fields, and the cost model's cache hit rate (it depends on what the cache held before the run)
WALL_FIELDS = HOST_CLOCK_FIELDS | {"hit_rate"}


def _hash(items: list[Any]) -> str:
    return hashlib.sha256(repr(items).encode()).hexdigest()[:16]


def digest_result(result: Any, ignore: frozenset[str] = frozenset()) -> dict[str, str]:
    """Digests of one ``RunResult``: rounds (without wall-clock fields), evals, final parameters, baseline."""
    rounds = [
        [(f.name, getattr(r, f.name)) for f in dataclasses.fields(r) if f.name not in WALL_FIELDS | ignore]
        for r in result.records
    ]
    params = hashlib.sha256()
    for name in sorted(result.state.params):
        params.update(name.encode())
        params.update(result.state.params[name].detach().contiguous().numpy().tobytes())
    return {
        "rounds": _hash(rounds),
        "evals": _hash([dataclasses.astuple(e) for e in result.evals]),
        "params": params.hexdigest()[:16],
        "baseline": repr(result.baseline_acc),
        "final": repr((result.final_eval.accuracy, result.final_eval.loss)),
    }


def phase_overrides(path: str, overrides: list[str], phase_rounds: int) -> list[str]:
    """For a config with phases (FedorAS's three), ``rounds=N`` cannot stand alone (the phases' rounds must add up
    to it): each phase gets ``phase_rounds`` and ``rounds`` their sum. Read from the YAML file itself, so that the
    same command runs on any version of rayfl."""
    import yaml

    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    phases = raw.get("phases") if isinstance(raw, dict) else None
    if not phases or phase_rounds <= 0:
        return overrides
    kept = [o for o in overrides if not o.startswith("rounds=")]
    each = [f"phases.{i}.rounds={phase_rounds}" for i in range(len(phases))]
    return [*kept, f"rounds={phase_rounds * len(phases)}", *each]


def digest_config(path: str, overrides: list[str], ignore: frozenset[str] = frozenset()) -> dict[str, str]:
    from rayfl.engine.driver import run_experiment
    from rayfl.experiment.loader import load_config

    with tempfile.TemporaryDirectory(prefix="rayfl-digest-") as out:
        cfg = load_config(path, [*overrides, f"output_dir={out}"])
        result = run_experiment(cfg, write=True)
        assert result.run_dir is not None
        clients = (result.run_dir / "clients.csv").read_text(encoding="utf-8")
    return {**digest_result(result, ignore), "clients": hashlib.sha256(clients.encode()).hexdigest()[:16]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--overrides", nargs="*", default=["rounds=2", "backend.kind=local"])
    parser.add_argument(
        "--phase-rounds", type=int, default=1, help="rounds per phase of a config with phases (0: overrides as given)"
    )
    parser.add_argument(
        "--ignore", nargs="*", default=[], help="record fields left out of the rounds digest (e.g. checkpoint_bytes, "
        "when the checkpoint format itself changed)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", type=Path, help="a JSON file written by --out: exit 1 on any difference")
    args = parser.parse_args()
    digests: dict[str, Any] = {}
    for path in args.configs:
        began = time.perf_counter()
        try:
            digests[path] = digest_config(
                path, phase_overrides(path, list(args.overrides), args.phase_rounds), frozenset(args.ignore)
            )
        except Exception as err:  # report and go on: data that cannot be had here (CIFAR-10, Shakespeare)
            digests[path] = {"skipped": f"{type(err).__name__}: {err}"[:200]}
        sys.stderr.write(f"{path}: {time.perf_counter() - began:.1f} s\n")
    text = json.dumps(digests, indent=1, sort_keys=True)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    if args.compare is not None:
        before = json.loads(args.compare.read_text(encoding="utf-8"))
        # configs matched by their resolved path: one file named absolutely before and relatively now is one config
        earlier = {_key(p): d for p, d in before.items()}
        missing = [p for p in digests if _key(p) not in earlier]
        changed = [p for p in digests if _key(p) in earlier and earlier[_key(p)] != digests[p]]
        for p in changed:
            print(f"CHANGED {p}: {earlier[_key(p)]} -> {digests[p]}")
        for p in missing:
            print(f"NOT COMPARED {p}: not in {args.compare}")
        compared = len(digests) - len(missing)
        print(f"{compared - len(changed)} of {compared} compared configs identical ({len(missing)} not compared)")
        raise SystemExit(1 if changed or missing else 0)


def _key(path: str) -> str:
    return str(Path(path).resolve())


if __name__ == "__main__":
    main()
