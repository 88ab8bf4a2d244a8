#!/usr/bin/env bash
# bash experiments/fedhen/run_all.sh [key=value ...]
#
# Paper 001's comparison on the CPU-sized settings experiments/fedhen/{iid,dirichlet}.yaml: FedHeN, NoSide and
# Decouple (only `algorithm` and the run name change, so data, model, device types and seed are the same), then the
# table of the simple and complex models' accuracy and the device average (experiments/fedhen/table.py) in
# OUT/results.md and their curves against rounds in OUT/curves.png. Extra arguments are overrides for every run (e.g. rounds=10). Runs land in OUT/<setting>-<method>
# (OUT defaults to runs/fedhen). About 2 minutes per run on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
OUT=${OUT:-runs/fedhen}
for arg in "$@"; do  # an output_dir override moves the table's inputs too
  case $arg in output_dir=*) OUT=${arg#output_dir=} ;; esac
done
METHODS=${METHODS:-fedhen noside decouple}
RAYFL=rayfl
PYTHON=python
if [[ -x .venv/bin/rayfl ]]; then RAYFL=.venv/bin/rayfl PYTHON=.venv/bin/python; fi
for setting in iid dirichlet; do
  for method in $METHODS; do
    rm -rf "${OUT:?}/$setting-$method"
    "$RAYFL" run "experiments/fedhen/$setting.yaml" name="$setting-$method" algorithm.name="$method" \
      output_dir="$OUT" "$@"
  done
done
"$PYTHON" experiments/fedhen/table.py "$OUT" "$OUT/curves.png" > "$OUT/results.md"
cat "$OUT/results.md"
