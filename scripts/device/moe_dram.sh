#!/usr/bin/env bash
# Bytes a moe-down tiling reads from HBM (Nsight Compute's dram__bytes_read, caches flushed before
# the profiled launch) next to the roofline's bytes: more than the roofline means weights read twice.
#   bash scripts/device/moe_dram.sh "GPU TP TOKENS TILING" ...
# Each quoted spec profiles one tiling label (as the sweep prints it) at TP and TOKENS on that GPU, via
# moe_profile.py; specs on different GPUs run at the same time. Needs a CUDA GPU and Nsight Compute (ncu on PATH,
# or NCU=/path/to/ncu). Writes dram-*.txt to OUT (default results/moe-dram in this repository) and prints the
# metrics of each. PYTHON: the interpreter with b70bench, CUDA torch and Triton (python3).
set -u -o pipefail
[[ $# -ge 1 ]] || { echo 'usage: bash scripts/device/moe_dram.sh "GPU TP TOKENS TILING" ...' >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/results/moe-dram}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
[[ ${PYTHON:-} == */* ]] && PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")  # before the cd
cd "$ROOT" || exit 1
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
[[ -n $NCU ]] || { echo "ncu not found: put Nsight Compute's ncu on PATH or set NCU" >&2; exit 1; }
METRICS=dram__bytes_read.sum,gpu__time_duration.sum,lts__t_sector_hit_rate.pct
one() {  # gpu tp tokens label
  CUDA_VISIBLE_DEVICES=$1 timeout 150 "$NCU" --clock-control none --cache-control all -k regex:_moe_down \
    --launch-skip 5 --launch-count 1 --metrics "$METRICS" "${PYTHON:-python3}" scripts/device/moe_profile.py \
    --tp "$2" --tokens "$3" --config "$4" > "$OUT/dram-tp$2-t$3-$4.txt" 2>&1
  echo "dram tp$2 t$3 $4 rc=$?"
}
declare -A busy=()
for spec in "$@"; do
  read -r gpu tp tok label <<< "$spec"
  [[ -n ${busy[$gpu]:-} ]] && wait "${busy[$gpu]}"
  one "$gpu" "$tp" "$tok" "$label" & busy[$gpu]=$!
done
wait
for f in "$OUT"/dram-*.txt; do
  echo "== $(basename "$f")"
  grep -E "roofline_bytes|dram__bytes_read|gpu__time_duration|lts__t_sector_hit_rate|ERR|rror" "$f" | head -8
done
