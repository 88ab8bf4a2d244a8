#!/usr/bin/env bash
# nice -n 10 bash experiments/distill/queue.sh
#
# Issue 17's whole CPU work queue, one job at a time, in the order that answers the main question first:
# 1. the key methods on the six CPU settings (experiments/distill/rerun.sh key; mini's key runs come first there);
#    `key-settings N ...` names the settings (default 1-6);
# 2. the probe: one round of each distillation variant on the same aggregated model (experiments/distill/probe.py)
#    on mini and on CPU setting 1;
# 3. Figure 10 in setting 5's set-up (search only: experiments/sweeps/search_eps_tmax_setting5.yaml);
# 4. the distillation sweep on mini (experiments/sweeps/distill_mini.yaml);
# 5. the other methods (rerun.sh rest) and two mini ablations of the core method: copy-and-average distillation and
#    the Eq. (2) update with its teacher frozen for the round (distill.teacher=round);
# 6. the server seconds per round at the paper's T_SKD = 100, K = 64 (benchmarks/distill_server.py).
# KEY_SETTINGS (default "1 2 3 4 5 6") limits stage 1 to those settings.
# Needs `rayfl` and `python` on PATH (e.g. PATH=.venv/bin:$PATH) and the repository on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
STAGES=("$@")
((${#STAGES[@]})) || STAGES=(key-settings probe fig10 sweep rest bench)
SETTINGS=(${KEY_SETTINGS:-1 2 3 4 5 6})
for stage in "${STAGES[@]}"; do
  echo "=== $stage $(date -u +%FT%TZ)"
  case $stage in
    key-settings)
      for n in "${SETTINGS[@]}"; do
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
    bench)
      python benchmarks/distill_server.py --iterations 100 --batch 64 --updates shared > runs/distill/bench-T100.md
      python benchmarks/distill_server.py --iterations 20 --batch 64 > runs/distill/bench-T20.md ;;
    *) echo "unknown stage '$stage'" >&2; exit 2 ;;
  esac
done
echo "=== done $(date -u +%FT%TZ)"
