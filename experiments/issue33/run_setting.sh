#!/usr/bin/env bash
# Issue 33, Build 5 at CPU scale: one CPU setting (experiments/paper/cpu/setting{N}.yaml) with the core method (with
# and without distillation, and without it under the set-up before issue 33) against HeteroFL, FedRolex, FjORD and
# FedAvg smallest / largest, for the seeds given, one run at a time. The run records (config.yaml, rounds.csv,
# clients.csv, client_accs.csv, summary.json, report.md) go to experiments/issue33/setting{N}/seedS/setting{N}-NAME/
# (a repository-relative output_dir, so no committed config holds a machine path); one line per run is appended to
# experiments/issue33/setting{N}/timings.tsv. The table is experiments/issue33/table.py's.
#   PYTHONPATH=$PWD bash experiments/issue33/run_setting.sh N [SEED ...]          (seeds 0 1 when none is given)
#   METHODS="model_search-no-distill heterofl" ...                                 (a subset, in that order)
# heterofl-no-clip (not in the default list): HeteroFL without its authors' gradient clipping at norm 1, a control.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PYTHON=${PYTHON:-python}
N=${1:?usage: run_setting.sh SETTING [SEED ...]}
shift
CFG=experiments/paper/cpu/setting$N.yaml
[[ -f $CFG ]] || { echo "no CPU setting '$N': $CFG does not exist" >&2; exit 2; }
OUT=${OUT:-experiments/issue33/setting$N}

# "Smallest" is FedAvg on the smallest structure of the setting's S, except in settings 1-2, where the paper takes
# HeteroFL's and FedRolex's own smallest model, every width at 0.0625 (experiments/paper/run_cpu.sh, smallest_ratios).
case $N in
  1 | 2) SMALLEST_RATIOS="[0.0625]" ;;
  *)
    SMALLEST_RATIOS=$("$PYTHON" - "$CFG" <<'PY'
import sys
from rayfl.experiment.loader import load_config
print("[" + ",".join(f"{r:g}" for r in load_config(sys.argv[1], []).algorithm.ratios) + "]")
PY
    ) || { echo "cannot read $CFG" >&2; exit 2; }
    ;;
esac

# The search set-up before issue 33 (as benchmarks/issue33_search_table.py's "core before, explore 0.2"): epsilon 0.8
# read as Algorithm 2 reads it (explore with probability 0.2), the space's own smallest structure, a transformer
# block's heads and MLP searched separately; in settings 1-2 also the exact levels at the old rounded values.
BEFORE="algorithm.distill.enabled=false algorithm.explore_probability=null algorithm.epsilon=0.8 algorithm.smallest=null algorithm.granularity=dimension"
case $N in
  1 | 2) BEFORE="$BEFORE system.memory.level_budget=exact system.memory.values=[103,89.7,83.2,81.9,81.6] system.bandwidth_down.level_budget=exact system.bandwidth_down.values=[0.713,0.182,0.0475,0.0137,0.0054]" ;;
esac

declare -A METHOD=(
  [largest]="algorithm.name=fedavg algorithm.budgets=ignore"
  [smallest]="algorithm.name=fedavg algorithm.model=smallest algorithm.ratios=$SMALLEST_RATIOS"
  [heterofl]="algorithm.name=heterofl"
  [heterofl-no-clip]="algorithm.name=heterofl algorithm.grad_clip_norm=0"
  [fedrolex]="algorithm.name=fedrolex"
  [fjord]="algorithm.name=fjord"
  [model_search]=""
  [model_search-no-distill]="algorithm.distill.enabled=false"
  [model_search-no-distill-before]="$BEFORE"
)
METHODS=${METHODS:-${ORDER:-model_search-no-distill heterofl fedrolex fjord smallest largest model_search model_search-no-distill-before}}
for m in $METHODS; do
  [[ -v "METHOD[$m]" ]] || { echo "unknown method '$m' (one of: ${!METHOD[*]})" >&2; exit 2; }
done
SEEDS=("$@")
((${#SEEDS[@]})) || SEEDS=(0 1)
mkdir -p "$OUT"
for seed in "${SEEDS[@]}"; do
  for m in $METHODS; do
    name=setting$N-$m
    dir=$OUT/seed$seed
    rm -rf "${dir:?}/$name"
    start=$SECONDS
    # shellcheck disable=SC2086  # the overrides hold no spaces
    "$PYTHON" -c "import sys; from rayfl.cli import main; sys.exit(main())" run "$CFG" name="$name" seed="$seed" \
      setting="setting$N" output_dir="$dir" checkpoint.every=0 export.final=false tracking.tensorboard=false \
      ${METHOD[$m]}
    rc=$?
    # the written config resolves paths: name this checkout's files relative to it, the shared folder as ../shared
    [[ -f $dir/$name/config.yaml ]] && sed -i -e "s#$(dirname "$PWD")/shared/#../shared/#g" -e "s#$PWD/##g" \
      "$dir/$name/config.yaml"
    rm -rf "$dir/$name"/*.parquet "$dir/$name"/*.png "$dir/$name"/events.out.* "$dir/$name/evals.csv" \
      "$dir/$name/checkpoints" "$dir/$name/models"
    printf 'seed%s\t%s\t%d\t%d\n' "$seed" "$m" $((SECONDS - start)) "$rc" | tee -a "$OUT/timings.tsv"
  done
done
