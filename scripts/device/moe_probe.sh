#!/usr/bin/env bash
# Where moe-down's decode rows lose time, on two CUDA GPUs (0 and 1) at once: the read and launch floors at the
# rows' sizes (read_floor.py: 4.9, 19.5 and 39 MB; docs/moe-down.md's "bare read" column) and Nsight Compute
# profiles (speed of light, memory, occupancy, warp state, scheduler, launch) of four of the sweep's fastest
# tilings at TP1/TP4 x tokens 1/4 (moe_profile.py).
#   bash scripts/device/moe_probe.sh
# Needs Nsight Compute (ncu on PATH, or NCU=/path/to/ncu). Writes floor.jsonl and ncu-*.txt to OUT (default
# results/moe-probe in this repository) and prints the floors and each profile's headline lines.
# PYTHON: the interpreter with b70bench, CUDA torch and Triton (python3).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/results/moe-probe}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
[[ ${PYTHON:-} == */* ]] && PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")  # before the cd
cd "$ROOT" || exit 1
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
[[ -n $NCU ]] || { echo "ncu not found: put Nsight Compute's ncu on PATH or set NCU" >&2; exit 1; }
echo "ncu: $NCU"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats"
SECTIONS+=" --section SchedulerStats --section LaunchStats"
prof() {  # gpu tp tokens label
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$1 timeout 120 "$NCU" --clock-control none --cache-control all -k regex:_moe_down \
    --launch-skip 5 --launch-count 1 $SECTIONS "$PY" scripts/device/moe_profile.py --tp "$2" --tokens "$3" \
    --config "$4" > "$OUT/ncu-tp$2-t$3-$4.txt" 2>&1; echo "ncu tp$2 t$3 $4 rc=$?"
}
(CUDA_VISIBLE_DEVICES=0 timeout 90 "$PY" scripts/device/read_floor.py 4.9 19.5 39 > "$OUT/floor.jsonl" 2>&1
 echo "floor rc=$?") &
prof 1 1 1 m1n64k256s1w8st1fused-packed
prof 1 1 1 m1n64k256s1w4st1fused
wait
prof 0 4 1 m1n64k128s1w4st1fused-packed &
prof 1 1 4 m1n128k128s1w4st1fused-packed
wait
cat "$OUT/floor.jsonl"
for f in "$OUT"/ncu-*.txt; do
  echo "== $(basename "$f")"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|\
Block Limit|Warp Cycles Per Issued|Issued Ipc|No Eligible|L2 Hit|Mem Busy|Max Bandwidth|Waves Per SM|Grid Size|OPT" \
    "$f" | head -40
done
