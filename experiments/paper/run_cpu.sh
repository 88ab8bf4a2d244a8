#!/usr/bin/env bash
# bash experiments/paper/run_cpu.sh [SETTING ...] [-- key=value ...]
#
# Runs the methods of paper 000's Table 3 on the CPU-sized settings experiments/paper/cpu/setting{1..6}.yaml (the
# settings named by number, e.g. `3 5`; all six when none is named), then writes the combined report: Table 3's
# layout (final accuracy and simulated hours, methods x settings), mean memory and bandwidth utilisation (Figure 6)
# and accuracy against rounds and simulated hours per setting (Figure 12), with `rayfl report --paper`.
#
# Every method runs its setting's YAML unchanged except for `algorithm` (and the run name), so data, model, budgets,
# traces and seed are the same for all of them. Overrides after `--` apply to every run (e.g. `-- rounds=5`).
#
# Environment:
#   METHODS  the methods to run, space separated (default: all of them, in Table 3's order):
#            largest smallest heterofl fjord fedrolex feddropout anycostfl model_search-no-distill model_search
#            heterofl-distill; also model_search-copies (the core method with the earlier copy-and-average
#            distillation, `algorithm.distill.update=copies`) and model_search-frozen (Eq. 2 with the teacher
#            frozen for the round, `algorithm.distill.teacher=round`), not in the default list
#   CONFIGS  the folder of setting{N}.yaml (default experiments/paper/cpu; experiments/paper runs the full size)
#   OUT      where runs go (default runs/paper-cpu): OUT/setting{N}/setting{N}-<method>; the report in OUT/report.md
#            covers every run under OUT, and OUT/timings.tsv gets one line per run (setting, method, seconds, exit)
set -uo pipefail
cd "$(dirname "$0")/../.."
# One intra-op thread: the server-side distillation runs in the driver process, and torch's default of one thread
# per core slowed it 10-50x on a shared 2-core machine (threads spinning while another process held a core).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
CONFIGS=${CONFIGS:-experiments/paper/cpu}
OUT=${OUT:-runs/paper-cpu}
METHODS=${METHODS:-largest smallest heterofl fjord fedrolex feddropout anycostfl model_search-no-distill model_search heterofl-distill}
RAYFL=rayfl
PYTHON=python
if [[ -x .venv/bin/rayfl ]]; then RAYFL=.venv/bin/rayfl PYTHON=.venv/bin/python; fi

SETTINGS=()
OVERRIDES=()
while (($#)); do
  if [[ $1 == -- ]]; then shift; OVERRIDES=("$@"); break; fi
  SETTINGS+=("$1")
  shift
done
((${#SETTINGS[@]})) || SETTINGS=(1 2 3 4 5 6)

# The search space S and the distillation settings of a setting's YAML: "fedavg smallest" needs S, and
# "heterofl-distill" adds the core method's distillation to HeteroFL ('w/' in Table 3).
setting_facts() {  # setting_facts FILE [OVERRIDE ...]: read with the run's overrides
  "$PYTHON" - "$@" <<'EOF'
import sys
from rayfl.experiment.loader import load_config
algo = load_config(sys.argv[1], sys.argv[2:]).algorithm
print("[" + ",".join(f"{r:g}" for r in algo.ratios) + "]")
d = algo.distill
print(f"algorithm.distill.enabled=true algorithm.distill.subnets={d.subnets} algorithm.distill.iterations="
      f"{d.iterations} algorithm.distill.batch_size={d.batch_size} algorithm.distill.lr={d.lr:g} "
      f"algorithm.distill.temperature={d.temperature:g} algorithm.distill.update={d.update} "
      f"algorithm.distill.optimizer_state={d.optimizer_state}")
EOF
}

# "Smallest" trains the smallest structure of S (Table 3's caption), except in settings 1-2, where the paper takes
# HeteroFL's and FedRolex's own smallest model, every width at 0.0625 (Sec. 4.1.1).
smallest_ratios() {
  case $1 in
    1 | 2) echo "[0.0625]" ;;
    *) echo "$RATIOS" ;;
  esac
}

method_overrides() {  # the overrides that turn the setting's YAML into method $1
  case $1 in
    largest) echo "algorithm.name=fedavg algorithm.budgets=ignore" ;;
    smallest) echo "algorithm.name=fedavg algorithm.model=smallest algorithm.ratios=$(smallest_ratios "$n")" ;;
    # HeteroFL and FedRolex bring their official set-up (clipping at norm 1, the family's plain activation, the
    # official initial model) as defaults of their configs: see README, "Baselines' set-up"
    heterofl | fedrolex | fjord | feddropout | anycostfl) echo "algorithm.name=$1" ;;
    heterofl-distill) echo "algorithm.name=heterofl $DISTILL" ;;
    model_search-no-distill) echo "algorithm.distill.enabled=false" ;;
    model_search-copies) echo "algorithm.distill.update=copies" ;;
    model_search-frozen) echo "algorithm.distill.teacher=round" ;;
    model_search) echo "" ;;
    *) echo "unknown method '$1'" >&2; return 1 ;;
  esac
}

mkdir -p "$OUT"
for n in "${SETTINGS[@]}"; do
  CFG=$CONFIGS/setting$n.yaml
  FACTS=$(setting_facts "$CFG" "${OVERRIDES[@]}") || { echo "cannot read $CFG" >&2; exit 2; }
  RATIOS=$(sed -n 1p <<<"$FACTS")
  DISTILL=$(sed -n 2p <<<"$FACTS")
  for method in $METHODS; do
    extra=$(method_overrides "$method") || exit 2
    name=setting$n-$method
    rm -rf "${OUT:?}/setting$n/$name"
    start=$SECONDS
    # shellcheck disable=SC2086  # $extra is a list of overrides without spaces inside them
    "$RAYFL" run "$CFG" name="$name" setting="setting$n" output_dir="$OUT/setting$n" $extra "${OVERRIDES[@]}"
    rc=$?
    printf 'setting%s\t%s\t%d\t%d\n' "$n" "$method" $((SECONDS - start)) "$rc" | tee -a "$OUT/timings.tsv"
  done
done

RUNS=()
for dir in "$OUT"/setting*/setting*-*; do
  [[ -f $dir/config.yaml ]] && RUNS+=("$dir")
done
((${#RUNS[@]})) && "$RAYFL" report "${RUNS[@]}" --out "$OUT" --paper
