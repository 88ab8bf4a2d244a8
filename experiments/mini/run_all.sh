#!/usr/bin/env bash
# bash experiments/mini/run_all.sh [key=value ...]
#
# Runs every method on the CPU-sized setting of experiments/mini/shakespeare_bert.yaml (same data, model, budgets,
# traces and seed; only `algorithm` changes), then writes the comparison table and plots with `rayfl report`.
# Extra arguments are overrides applied to every run (e.g. rounds=10 backend.kind=local).
# Runs land in runs/mini/<name>; the report in runs/mini/report.md.
#
# Environment: METHODS, the methods to run, space separated (default: all but model_search-frozen). First the
# comparison, the methods without server-side distillation, which all learn at this scale: largest smallest heterofl
# fedrolex feddropout anycostfl fjord model_search-no-distill (the core method without distillation); then the
# variants with paper 000's in-place distillation, kept by name: model_search (Eq. 2 as the paper writes it, the
# YAML's own method; at CPU scale it ends near the most-frequent-label baseline, docs/reproductions.md), heterofl-distill
# (likewise), model_search-copies (the earlier copy-and-average distillation, `algorithm.distill.update=copies`) and
# model_search-frozen (Eq. 2 with the teacher frozen for the round, `algorithm.distill.teacher=round`).
# KEEP=DIR copies each run's rounds.csv, evals.csv, config.yaml and summary.json to DIR/<name>/ (the table in
# docs/reproductions.md comes from experiments/mini/results: python experiments/mini/table.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
CFG=experiments/mini/shakespeare_bert.yaml
OUT=runs/mini
for arg in "$@"; do  # an output_dir override moves the report's inputs too
  case $arg in output_dir=*) OUT=${arg#output_dir=} ;; esac
done
METHODS=${METHODS:-largest smallest heterofl fedrolex feddropout anycostfl fjord model_search-no-distill model_search heterofl-distill model_search-copies}
RAYFL=rayfl
PYTHON=python
if [[ -x .venv/bin/rayfl ]]; then RAYFL=.venv/bin/rayfl PYTHON=.venv/bin/python; fi
# The core method's distillation settings from the YAML and the overrides, for methods that add it ("w/" in paper
# 000's Table 3).
read -r -a DISTILL <<<"$("$PYTHON" - "$CFG" "$@" <<'PY'
import sys
from rayfl.experiment.loader import load_config
d = load_config(sys.argv[1], sys.argv[2:]).algorithm.distill
print(f"algorithm.distill.enabled=true algorithm.distill.subnets={d.subnets} algorithm.distill.iterations="
      f"{d.iterations} algorithm.distill.batch_size={d.batch_size} algorithm.distill.lr={d.lr:g} "
      f"algorithm.distill.temperature={d.temperature:g} algorithm.distill.update={d.update} "
      f"algorithm.distill.optimizer_state={d.optimizer_state}")
PY
)"

run() {
  local name=$1
  shift
  rm -rf "${OUT:?}/mini-$name"
  "$RAYFL" run "$CFG" name="mini-$name" "$@"
}

for method in $METHODS; do
  case $method in
    largest) run largest algorithm.name=fedavg algorithm.budgets=ignore "$@" ;;
    smallest) run smallest algorithm.name=fedavg algorithm.model=smallest "algorithm.ratios=[0,0.5,1]" "$@" ;;
    # HeteroFL and FedRolex bring their official set-up (clipping at norm 1, GELU, the official initial model) as
    # defaults of their configs (experiments/paper/README.md, "Baselines' set-up")
    heterofl | fedrolex | feddropout | anycostfl | fjord) run "$method" algorithm.name="$method" "$@" ;;
    heterofl-distill) run heterofl-distill algorithm.name=heterofl "${DISTILL[@]}" "$@" ;;
    model_search-no-distill) run model_search-no-distill algorithm.distill.enabled=false "$@" ;;
    model_search) run model_search "$@" ;;
    model_search-copies) run model_search-copies algorithm.distill.update=copies "$@" ;;
    model_search-frozen) run model_search-frozen algorithm.distill.teacher=round "$@" ;;
    *) echo "unknown method '$method'" >&2; exit 2 ;;
  esac
done

RUNS=()
for dir in "$OUT"/mini-*; do
  [[ -f $dir/config.yaml ]] && RUNS+=("$dir")
done
"$RAYFL" report "${RUNS[@]}" --out "$OUT"
if [[ -n ${KEEP:-} ]]; then
  for dir in "${RUNS[@]}"; do
    mkdir -p "$KEEP/${dir##*/}"
    cp "$dir"/{rounds.csv,evals.csv,config.yaml,summary.json} "$KEEP/${dir##*/}/"
  done
  "$PYTHON" experiments/mini/table.py "$KEEP"
fi
