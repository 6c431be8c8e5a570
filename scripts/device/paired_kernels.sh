#!/usr/bin/env bash
# The paired measurement engine on one CUDA GPU, through a target that needs no vLLM (`compare --suite moe-down`:
# each side a moe-down kernel in a process of its own with its own Triton cache, one process at a time):
# an A/A pair (triton-htile against itself) and a known kernel slowdown (the untuned `triton` tiling against
# `triton-htile`), at TP4 and 1 token, each a `compare --placement alternate`. First, the plan `compare --plan`
# prints for a cuda stack (a placeholder model directory: the plan reads no weights and starts nothing).
#   bash scripts/device/paired_kernels.sh [BUDGET_MIN]   (default 3 minutes a compare)
# PAIRS: which compares, of "aa slow" (default both), e.g. PAIRS=slow for the slowdown alone.
# Writes paired-kernels.log and aa.json / slow.json to OUT (default results/paired-kernels in this repository), the
# block files, logs and Triton caches under BLOCKS (default results/paired-kernels-blocks).
# PYTHON: the interpreter with b70bench, CUDA torch and Triton (python3).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/results/paired-kernels}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
[[ ${PYTHON:-} == */* ]] && PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")  # before the cd
cd "$ROOT" || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
BUDGET=${1:-3}
BLOCKS=${BLOCKS:-$ROOT/results/paired-kernels-blocks}
C="timeout $((BUDGET * 60 + 150)) ${PYTHON:-python3} -m b70bench compare --suite moe-down --backend cuda"
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  mkdir -p "$BLOCKS/plan/model"
  printf 'name = "h200-plan"\nbackend = "cuda"\ndevices = [0]\nmodel = "./model"\nmemory_fraction = 0.9\n' \
    > "$BLOCKS/plan/cuda.toml"
  # Two commits where the copy has its history, else the one series directory on both sides.
  if git rev-parse -q --verify HEAD~1 >/dev/null 2>&1; then sides="HEAD~1 HEAD"; else sides="patches/series patches/series"; fi
  ${PYTHON:-python3} -m b70bench compare $sides --stack "$BLOCKS/plan/cuda.toml" --plan
  echo "plan exit $?"
  declare -A AB=([aa]="triton-htile triton-htile" [slow]="triton-htile triton")
  for name in ${PAIRS:-aa slow}; do
    set -- "$name" ${AB[$name]}
    echo "== $1: A=$2 B=$3"
    $C "$2" "$3" --placement alternate --budget "$BUDGET" --out-dir "$BLOCKS/$1" --json "$OUT/$1.json"
    echo "exit $?"
    ps -eo pid,args | grep -c "[b]70bench.moe.live" | sed 's/^/kernel processes left: /'
  done
  date -u
} 2>&1 | tee "$OUT/paired-kernels.log"
