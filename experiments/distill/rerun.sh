#!/usr/bin/env bash
# nice -n 10 bash experiments/distill/rerun.sh [PHASE ...]
#
# Issue 17's re-run with the corrected (Eq. 2) in-place distillation, one run at a time: PHASE `key` runs the core
# method with and without distillation and HeteroFL with and without it, on the mini setting and the six CPU
# settings; PHASE `rest` runs FedRolex, FjORD, FedAvg smallest and largest on the same settings. Default: key, then
# rest. experiments/distill/queue.sh runs this with the sweeps and ablations in between.
# Runs go to runs/distill/{mini,paper-cpu}; each setting's report is rewritten after its runs
# (runs/distill/paper-cpu/report.md, runs/distill/mini/report.md); experiments/distill/tables.py builds the tables.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
PHASES=("$@")
((${#PHASES[@]})) || PHASES=(key rest)
for phase in "${PHASES[@]}"; do
  case $phase in
    key) METHODS="model_search model_search-no-distill heterofl heterofl-distill" ;;
    rest) METHODS="fedrolex fjord smallest largest" ;;
    *) echo "unknown phase '$phase' (key | rest)" >&2; exit 2 ;;
  esac
  METHODS=$METHODS bash experiments/mini/run_all.sh output_dir=runs/distill/mini backend.kind=local
  for n in 1 2 3 4 5 6; do
    METHODS=$METHODS OUT=runs/distill/paper-cpu bash experiments/paper/run_cpu.sh "$n"
  done
done
