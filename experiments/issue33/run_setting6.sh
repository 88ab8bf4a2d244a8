#!/usr/bin/env bash
# Setting 6's re-run (kept for its records): run_setting.sh 6 with the order it was run in.
#   PYTHONPATH=$PWD bash experiments/issue33/run_setting6.sh [SEED ...]
cd "$(dirname "$0")/../.." || exit 2
ORDER=${ORDER:-model_search-no-distill heterofl model_search-no-distill-before model_search fedrolex fjord smallest largest}
METHODS=${METHODS:-$ORDER} exec bash experiments/issue33/run_setting.sh 6 "$@"
