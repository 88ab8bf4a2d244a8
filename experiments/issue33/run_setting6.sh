#!/usr/bin/env bash
# Issue 33, Build 5 at CPU scale, one setting: the CPU setting 6 (experiments/paper/cpu/setting6.yaml, 30 rounds)
# with the core method (with and without distillation, and without it under the set-up before issue 33) against
# HeteroFL, FedRolex, FjORD and FedAvg smallest / largest, seeds 0 and 1, one run at a time. The run records
# (config.yaml, rounds.csv, clients.csv, summary.json) go to experiments/issue33/setting6/seedS/NAME/; the table is
# experiments/issue33/table.py's.
#   PYTHONPATH=$PWD bash experiments/issue33/run_setting6.sh [SEED ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PYTHON=${PYTHON:-python}
CFG=experiments/paper/cpu/setting6.yaml
OUT=${OUT:-experiments/issue33/setting6}
declare -A METHOD=(
  [largest]="algorithm.name=fedavg algorithm.budgets=ignore"
  [smallest]="algorithm.name=fedavg algorithm.model=smallest algorithm.ratios=[0,0.5,1]"
  [heterofl]="algorithm.name=heterofl"
  [fedrolex]="algorithm.name=fedrolex"
  [fjord]="algorithm.name=fjord"
  [model_search]=""
  [model_search-no-distill]="algorithm.distill.enabled=false"
  [model_search-no-distill-before]="algorithm.distill.enabled=false algorithm.explore_probability=null algorithm.epsilon=0.8 algorithm.granularity=dimension"
)
ORDER=${ORDER:-model_search-no-distill heterofl model_search-no-distill-before model_search fedrolex fjord smallest largest}
SEEDS=("$@")
((${#SEEDS[@]})) || SEEDS=(0 1)
for seed in "${SEEDS[@]}"; do
  for m in $ORDER; do
    name=setting6-$m
    dir=$OUT/seed$seed
    rm -rf "${dir:?}/$name"
    start=$SECONDS
    # shellcheck disable=SC2086  # the overrides hold no spaces
    "$PYTHON" -c "import sys; from rayfl.cli import main; sys.exit(main())" run "$CFG" name="$name" seed="$seed" \
      setting=setting6 output_dir="$dir" checkpoint.every=0 export.final=false tracking.tensorboard=false \
      ${METHOD[$m]}
    rc=$?
    rm -rf "$dir/$name"/*.parquet "$dir/$name"/*.png "$dir/$name"/events.out.* "$dir/$name/evals.csv" "$dir/$name/checkpoints" "$dir/$name/models"
    printf 'seed%s\t%s\t%d\t%d\n' "$seed" "$m" $((SECONDS - start)) "$rc" | tee -a "$OUT/timings.tsv"
  done
done
