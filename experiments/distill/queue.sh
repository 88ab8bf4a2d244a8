#!/usr/bin/env bash
# nice -n 10 bash experiments/distill/queue.sh
#
# Issue 17's whole CPU work queue, one job at a time, in the order that answers the main question first:
# 1. the key methods on the six CPU settings (experiments/distill/rerun.sh key; mini's key runs come first there);
# 2. Figure 10 in setting 5's set-up (search only: experiments/sweeps/search_eps_tmax_setting5.yaml);
# 3. the distillation sweep on mini (experiments/sweeps/distill_mini.yaml);
# 4. the probe: one round of each distillation variant on the same aggregated model (experiments/distill/probe.py)
#    on mini and on CPU setting 1;
# 5. the other methods (rerun.sh rest) and two mini ablations of the core method: copy-and-average distillation and
#    the Eq. (2) update with its teacher frozen for the round (distill.teacher=round).
# Needs `rayfl` and `python` on PATH (e.g. PATH=.venv/bin:$PATH) and the repository on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
STAGES=("$@")
((${#STAGES[@]})) || STAGES=(key-settings fig10 sweep probe rest)
for stage in "${STAGES[@]}"; do
  echo "=== $stage $(date -u +%FT%TZ)"
  case $stage in
    key-settings)
      for n in 1 2 3 4 5 6; do
        METHODS="model_search model_search-no-distill heterofl heterofl-distill" OUT=runs/distill/paper-cpu \
          bash experiments/paper/run_cpu.sh "$n"
      done ;;
    fig10) rayfl sweep experiments/sweeps/search_eps_tmax_setting5.yaml ;;
    sweep) rayfl sweep experiments/sweeps/distill_mini.yaml ;;
    probe)
      python experiments/distill/probe.py experiments/mini/shakespeare_bert.yaml --rounds 8 20 \
        --iterations 1 5 20 --out runs/distill/probe-mini.md
      python experiments/distill/probe.py experiments/paper/cpu/setting1.yaml --rounds 10 20 \
        --iterations 1 5 20 --out runs/distill/probe-setting1.md ;;
    rest)
      METHODS="model_search-copies model_search-frozen" bash experiments/mini/run_all.sh \
        output_dir=runs/distill/mini backend.kind=local
      bash experiments/distill/rerun.sh rest ;;
    *) echo "unknown stage '$stage'" >&2; exit 2 ;;
  esac
done
echo "=== done $(date -u +%FT%TZ)"
