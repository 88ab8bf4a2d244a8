#!/usr/bin/env bash
# nice -n 10 bash experiments/distill/rerun.sh [PHASE ...]
#
# Issue 17's re-run with the corrected (Eq. 2) in-place distillation, one run at a time, on the mini setting and the
# six CPU settings. PHASEs:
#   key        the core method with and without distillation, HeteroFL with and without it
#   rest       FedRolex, FjORD, FedAvg smallest and largest
#   baselines  the cells the baselines' official set-up changed (HeteroFL and FedRolex now default to GELU in the
#              transformer settings, FedRolex to the official initial model): HeteroFL with and without distillation
#              and FedRolex on mini and settings 5-6, FedRolex on settings 1-4
#   seeds      a second seed (seed=1) of the key pairs, core method with and without distillation and HeteroFL
#              without, on mini and the settings whose accuracies are not all near chance (1, 3, 5, 6); runs go to
#              runs/distill/seed1/{mini,paper-cpu}
# Default: key, then rest. experiments/distill/queue.sh runs key and rest with the sweeps and ablations in between.
# Runs go to runs/distill/{mini,paper-cpu}; each setting's report is rewritten after its runs; the tables come from
# experiments/distill/tables.py.
#
# TRACES: the folder of the real traces (default: the YAMLs' own relative paths, ../shared/traces-real beside the
# checkout); set it when the checkout lies elsewhere, e.g. TRACES=<the folder holding shared>/shared/traces-real in a git worktree.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
PHASES=("$@")
((${#PHASES[@]})) || PHASES=(key rest)

traces() {  # the trace overrides of setting $1 (mini, 1-6) when TRACES is set
  [[ -n ${TRACES:-} ]] || return 0
  case $1 in
    5) echo "system.bandwidth_down.file=$TRACES/mobilebandwidth-sigcomm22/wifi5.csv" ;;
    6 | mini) echo "system.bandwidth_down.directory=$TRACES/mahimahi-cellular" \
      "system.bandwidth_up.directory=$TRACES/mahimahi-cellular" ;;
  esac
}

# run_settings METHODS OUT_ROOT SETTING... [-- OVERRIDE...]: the methods on each setting (mini or 1-6)
run_settings() {
  local methods=$1 root=$2
  shift 2
  local settings=() extra=()
  while (($#)); do
    if [[ $1 == -- ]]; then shift; extra=("$@"); break; fi
    settings+=("$1")
    shift
  done
  for n in "${settings[@]}"; do
    # shellcheck disable=SC2046  # traces() prints overrides without spaces inside them
    if [[ $n == mini ]]; then
      METHODS=$methods bash experiments/mini/run_all.sh output_dir="$root/mini" backend.kind=local \
        $(traces mini) "${extra[@]}"
    else
      METHODS=$methods OUT=$root/paper-cpu bash experiments/paper/run_cpu.sh "$n" -- $(traces "$n") "${extra[@]}"
    fi
  done
}

for phase in "${PHASES[@]}"; do
  case $phase in
    key) run_settings "model_search model_search-no-distill heterofl heterofl-distill" runs/distill mini 1 2 3 4 5 6 ;;
    rest) run_settings "fedrolex fjord smallest largest" runs/distill mini 1 2 3 4 5 6 ;;
    baselines)
      run_settings "heterofl heterofl-distill fedrolex" runs/distill mini 5 6
      run_settings "fedrolex" runs/distill 1 2 3 4 ;;
    seeds) run_settings "model_search model_search-no-distill heterofl" runs/distill/seed1 mini 1 3 5 6 -- seed=1 ;;
    *) echo "unknown phase '$phase' (key | rest | baselines | seeds)" >&2; exit 2 ;;
  esac
done
