#!/usr/bin/env bash
# Bytes a moe-down tiling reads from HBM (Nsight Compute's dram__bytes_read, caches flushed before
# the profiled launch) next to the roofline's bytes: more than the roofline means weights read twice.
#   bash scripts/device/moe_dram.sh "GPU TP TOKENS LABEL" ...   (each quoted spec runs on its GPU;
#   specs on different GPUs run at the same time). Writes $OUT/dram-*.txt and prints one line each.
set -u -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/moe-dram-out}; mkdir -p "$OUT"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n $NCU ]] || { echo "ncu not found"; exit 1; }
METRICS=dram__bytes_read.sum,gpu__time_duration.sum,lts__t_sector_hit_rate.pct
one() {  # gpu tp tokens label
  CUDA_VISIBLE_DEVICES=$1 timeout 150 "$NCU" --clock-control none --cache-control all -k regex:_moe_down \
    --launch-skip 5 --launch-count 1 --metrics "$METRICS" python3 scripts/device/moe_profile.py --tp "$2" \
    --tokens "$3" --config "$4" > "$OUT/dram-tp$2-t$3-$4.txt" 2>&1
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
