#!/usr/bin/env bash
# bash experiments/fedhen/run_all.sh [key=value ...]
#
# Paper 001's comparison on the CPU-sized settings experiments/fedhen/{iid,dirichlet}.yaml: FedHeN, NoSide and
# Decouple for every seed of SEEDS (default "0 1"; the seed draws the synthetic data, the initial model and the
# sampling; only `algorithm`, `seed` and the run name change between runs), one run after another, then the table of
# the simple and complex models' accuracy and the device averages, mean and spread over seeds
# (experiments/fedhen/table.py), in OUT/results.md, and their curves against rounds in OUT/curves.png. Extra arguments
# are overrides for every run (e.g. rounds=10). Runs land in OUT/<setting>-<method>-s<seed> (OUT defaults to
# runs/fedhen). About 5 CPU minutes per run.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
OUT=${OUT:-runs/fedhen}
for arg in "$@"; do  # an output_dir override moves the table's inputs too
  case $arg in output_dir=*) OUT=${arg#output_dir=} ;; esac
done
METHODS=${METHODS:-fedhen noside decouple}
SEEDS=${SEEDS:-0 1}
RAYFL=rayfl
PYTHON=python
if [[ -x .venv/bin/rayfl ]]; then RAYFL=.venv/bin/rayfl PYTHON=.venv/bin/python; fi
for seed in $SEEDS; do  # seed by seed, so that a cut-short sweep leaves whole seeds
  for setting in iid dirichlet; do
    for method in $METHODS; do
      rm -rf "${OUT:?}/$setting-$method-s$seed"
      "$RAYFL" run "experiments/fedhen/$setting.yaml" name="$setting-$method-s$seed" algorithm.name="$method" \
        seed="$seed" output_dir="$OUT" "$@"
    done
  done
done
"$PYTHON" experiments/fedhen/table.py "$OUT" "$OUT/curves.png" > "$OUT/results.md"
cat "$OUT/results.md"
