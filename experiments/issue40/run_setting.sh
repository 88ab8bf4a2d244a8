#!/usr/bin/env bash
# Issue 40, item 6: one calibrated CPU setting (experiments/paper/cpu/setting{N}.yaml) with the core method with and
# without in-place distillation, HeteroFL with and without it (paper 000's Fig. 7), FedRolex, FjORD and FedAvg on the
# smallest and the largest model, on equal terms (item 5), for the seeds given, one run at a time.
#   PYTHONPATH=$PWD bash experiments/issue40/run_setting.sh N [SEED ...]        (seeds 0 1 2 when none is given)
#   METHODS="core heterofl" ...                                                   (a subset, in that order)
# Records: experiments/issue40/setting{N}/seedS/NAME/ (config.yaml with repository-relative paths, rounds.csv,
# clients.csv, evals.csv, summary.json); one line per run in experiments/issue40/setting{N}/timings.tsv. The tables:
# experiments/issue40/table.py.
#
# Equal terms (item 5). Every method of the main table is scored by the same protocol, the global model in evaluation
# mode with batch norms that normalise with the test batch's statistics (rayfl's families keep no running statistics):
# HeteroFL's static BN (the server re-estimates the statistics on the pooled training set) is switched off, and shown
# as the ablation `heterofl-static-bn`. No method clips gradients: HeteroFL's and FedRolex's official clipping at
# norm 1 is switched off, and shown as the ablation `heterofl-clip`. HeteroFL and FedRolex train with the setting's
# activation (`algorithm.act=model`) as every other method, not their code's plain ReLU. The width-sliced methods
# (HeteroFL, FedRolex, FjORD) are also scored at their sub-widths (`eval_widths`), so the table can show each at the
# largest width it trained. `core-distill-lr1e-4` is a control: the core method with the distillation's Adam at a
# tenth of the paper's learning rate (how far the server's T_SKD steps move the model against the clients' steps);
# `core-distill-data` is the other control: the core method distilling at the paper's learning rate on samples of the
# pooled training set instead of Gaussian noise (`distill.noise=data`; paper 000's server holds no data): whether the
# noise or the steps themselves do the harm; `core-distill-follow` scales the distillation's learning rate by the
# clients' schedule each round (`distill.lr_schedule=clients`), so the server's steps shrink when the clients' do.
# Local work is the setting's (same epochs, batch, optimizer, schedule) for every method;
# FjORD's own self-distillation (`kd`) and per-batch width draws are part of the method and stay.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PYTHON=${PYTHON:-python}
N=${1:?usage: run_setting.sh SETTING [SEED ...]}
shift
CFG=experiments/paper/cpu/setting$N.yaml
[[ -f $CFG ]] || { echo "no CPU setting '$N': $CFG does not exist" >&2; exit 2; }
OUT=${OUT:-experiments/issue40/setting$N}

# The setting's S and its distillation (HeteroFL with distillation: the core method's n, T_SKD, K, lr and update,
# sub-nets drawn from HeteroFL's own rates, as issue 33 ran it), read with the same loader as the runs.
FACTS=$("$PYTHON" - "$CFG" <<'PY'
import sys
from rayfl.experiment.loader import load_config
algo = load_config(sys.argv[1], []).algorithm
print("[" + ",".join(f"{r:g}" for r in algo.ratios) + "]")
d = algo.distill
print(f"algorithm.distill.enabled=true algorithm.distill.subnets={d.subnets} algorithm.distill.iterations={d.iterations} "
      f"algorithm.distill.batch_size={d.batch_size} algorithm.distill.lr={d.lr:g} algorithm.distill.update={d.update}")
PY
) || { echo "cannot read $CFG" >&2; exit 2; }
RATIOS=$(sed -n 1p <<<"$FACTS")
DISTILL=$(sed -n 2p <<<"$FACTS")
# FedAvg smallest: the smallest structure of S, except in settings 1-2, where the paper takes HeteroFL's and
# FedRolex's own smallest model, every width at 0.0625 (experiments/paper/run_cpu.sh, smallest_ratios), and in
# setting 5, where S = {0, 1} would remove every block of the ViT (patch embedding, pooling and classifier: issue 33's
# runs of it stayed at chance, 0.100 in 30 rounds here too) and the smallest model is Table 2's smallest client model,
# ViT-tiny-tiny (one block), as the core method's algorithm.smallest.
case $N in
  1 | 2) SMALLEST="algorithm.ratios=[0.0625]" ;;
  5) SMALLEST="algorithm.ratios=$RATIOS algorithm.smallest_blocks=[1]" ;;
  *) SMALLEST="algorithm.ratios=$RATIOS" ;;
esac
WIDTHS="eval_widths=[0.5,0.25]"
# the distillation's copies train one at a time (two runs share the two cores); any value gives the same records
DW="algorithm.distill.workers=${DISTILL_WORKERS:-1}"
HETEROFL="algorithm.name=heterofl algorithm.static_bn=false algorithm.grad_clip_norm=0 algorithm.act=model $WIDTHS"

declare -A METHOD=(
  [core]="$DW"
  [core-no-distill]="algorithm.distill.enabled=false"
  [heterofl]="$HETEROFL"
  [heterofl-distill]="$HETEROFL $DISTILL $DW"
  [fedrolex]="algorithm.name=fedrolex algorithm.grad_clip_norm=0 algorithm.act=model $WIDTHS"
  [fjord]="algorithm.name=fjord $WIDTHS"
  [smallest]="algorithm.name=fedavg algorithm.model=smallest $SMALLEST"
  [largest]="algorithm.name=fedavg algorithm.budgets=ignore"
  [core-distill-lr1e-4]="algorithm.distill.lr=0.0001 $DW"
  [core-distill-data]="algorithm.distill.noise=data $DW"
  [core-distill-follow]="algorithm.distill.lr_schedule=clients $DW"
  [heterofl-static-bn]="algorithm.name=heterofl algorithm.static_bn=true algorithm.grad_clip_norm=0 algorithm.act=model"
  [heterofl-clip]="algorithm.name=heterofl algorithm.static_bn=false algorithm.grad_clip_norm=1 algorithm.act=model $WIDTHS"
)
METHODS=${METHODS:-largest smallest core-no-distill core heterofl heterofl-distill fedrolex fjord}
for m in $METHODS; do
  [[ -v "METHOD[$m]" ]] || { echo "unknown method '$m' (one of: ${!METHOD[*]})" >&2; exit 2; }
done
SEEDS=("$@")
((${#SEEDS[@]})) || SEEDS=(0 1 2)
mkdir -p "$OUT"
for seed in "${SEEDS[@]}"; do
  for m in $METHODS; do
    dir=$OUT/seed$seed
    rm -rf "${dir:?}/$m"
    start=$SECONDS
    # shellcheck disable=SC2086  # the overrides hold no spaces
    "$PYTHON" -c "import sys; from rayfl.cli import main; sys.exit(main())" run "$CFG" name="$m" seed="$seed" \
      setting="setting$N" output_dir="$dir" checkpoint.every=0 export.final=false tracking.tensorboard=false \
      ${METHOD[$m]}
    rc=$?
    # the written config resolves paths: name this checkout's files relative to it, the shared folder as ../shared,
    # and the user's cache (the trace sets) as ~/
    [[ -f $dir/$m/config.yaml ]] && sed -i -e "s#$(dirname "$PWD")/shared/#../shared/#g" -e "s#$PWD/##g" \
      -e "s#$HOME/#~/#g" "$dir/$m/config.yaml"
    rm -rf "$dir/$m"/*.parquet "$dir/$m"/*.png "$dir/$m"/events.out.* "$dir/$m/checkpoints" "$dir/$m/models" \
      "$dir/$m/report.md"
    printf 'seed%s\t%s\t%d\t%d\n' "$seed" "$m" $((SECONDS - start)) "$rc" | tee -a "$OUT/timings.tsv"
  done
done
