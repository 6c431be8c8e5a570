#!/usr/bin/env bash
# Where the decode rows of moe-down lose time, in one device call (GPU 0 and 1 at once):
# the read/launch floors at the row sizes (read_floor.py) and Nsight Compute profiles of the
# sweep's fastest tilings (moe_profile.py). Writes $OUT/probe.tar.gz and prints a summary.
#   run(command="B70BENCH_COMMIT=<sha> bash scripts/device/moe_probe.sh", kind="nvidia-h200-x2")
set -u -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/moe-probe-out}; W=/tmp/moe-probe; rm -rf "$W"; mkdir -p "$W" "$OUT"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats"
prof() {  # gpu tp tokens label
  CUDA_VISIBLE_DEVICES=$1 timeout 120 "$NCU" --clock-control none --cache-control all -k regex:_moe_down \
    --launch-skip 5 --launch-count 1 $SECTIONS python3 scripts/device/moe_profile.py --tp "$2" --tokens "$3" \
    --config "$4" > "$W/ncu-tp$2-t$3-$4.txt" 2>&1; echo "ncu tp$2 t$3 $4 rc=$?"
}
(CUDA_VISIBLE_DEVICES=0 timeout 90 python3 scripts/device/read_floor.py 4.9 19.5 39 > "$W/floor.jsonl" 2>&1; echo "floor rc=$?") &
prof 1 1 1 m1n64k256s1w8st1fused-packed
prof 1 1 1 m1n64k256s1w4st1fused
wait
prof 0 4 1 m1n64k128s1w4st1fused-packed &
prof 1 1 4 m1n128k128s1w4st1fused-packed
wait
cat "$W/floor.jsonl"
for f in "$W"/ncu-*.txt; do
  echo "== $f"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issued Ipc|No Eligible|L2 Hit|Mem Busy|Max Bandwidth|Waves Per SM|Grid Size|OPT" "$f" | head -40
done
tar -czf "$OUT/probe.tar.gz" -C /tmp moe-probe
