#!/usr/bin/env bash
# bash experiments/mini/run_all.sh [key=value ...]
#
# Runs every method on the CPU-sized setting of experiments/mini/shakespeare_bert.yaml (same data, model, budgets,
# traces and seed; only `algorithm` changes), then writes the comparison table and plots with `rayfl report`.
# Extra arguments are overrides applied to every run (e.g. rounds=10 backend.kind=local).
# Runs land in runs/mini/<name>; the report in runs/mini/report.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
CFG=experiments/mini/shakespeare_bert.yaml
OUT=runs/mini
for arg in "$@"; do  # an output_dir override moves the report's inputs too
  case $arg in output_dir=*) OUT=${arg#output_dir=} ;; esac
done
# The distillation settings of the core method, for methods that add it ("w/" in paper 000's Table 3).
DISTILL=(algorithm.distill.enabled=true algorithm.distill.subnets=5 algorithm.distill.iterations=10
         algorithm.distill.batch_size=32)

run() {
  local name=$1
  shift
  rm -rf "${OUT:?}/mini-$name"
  rayfl run "$CFG" name="mini-$name" "$@"
}

run largest algorithm.name=fedavg algorithm.budgets=ignore "$@"
run smallest algorithm.name=fedavg algorithm.model=smallest "algorithm.ratios=[0,0.5,1]" "$@"
# HeteroFL and FedRolex clip gradients at norm 1 on every local step, as their official codes do.
run heterofl algorithm.name=heterofl train.grad_clip_norm=1 "$@"
run heterofl-distill algorithm.name=heterofl train.grad_clip_norm=1 "${DISTILL[@]}" "$@"
run fedrolex algorithm.name=fedrolex train.grad_clip_norm=1 "$@"
run feddropout algorithm.name=feddropout "$@"
run anycostfl algorithm.name=anycostfl "$@"
run fjord algorithm.name=fjord "$@"
run model_search-no-distill algorithm.distill.enabled=false "$@"
run model_search "$@"

rayfl report "$OUT"/mini-largest "$OUT"/mini-smallest "$OUT"/mini-heterofl "$OUT"/mini-heterofl-distill \
  "$OUT"/mini-fedrolex "$OUT"/mini-feddropout "$OUT"/mini-anycostfl "$OUT"/mini-fjord \
  "$OUT"/mini-model_search-no-distill "$OUT"/mini-model_search --out "$OUT"
