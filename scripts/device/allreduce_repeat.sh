#!/usr/bin/env bash
# Issue 3, second call (kind nvidia-h200-x2): the baseline's own spread (minimal loop 2 more times,
# eager and graph) and one probe of the graph-mode in-place penalty (NCCL_GRAPH_REGISTER=0).
# run(command="bash scripts/device/allreduce_repeat.sh", kind="nvidia-h200-x2")
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/b70bench-out}; mkdir -p "$OUT"; START=$SECONDS
exec > >(tee "$OUT/allreduce-repeat.log") 2>&1
date -u +%FT%TZ
TR="timeout 100 python3 -m torch.distributed.run --standalone --nproc-per-node 2"
for i in 2 3; do
  for how in eager graph; do
    flag=""; [ $how = graph ] && flag="--graph"
    $TR scripts/device/minimal_allreduce.py $flag > "$OUT/minimal-$how-$i.json"; echo "minimal $how $i rc=$? at $((SECONDS - START)) s"
  done
done
B="timeout 100 env PYTHONPATH=. python3 -m b70bench allreduce --world-size 2 --timeout 90 --graph --sizes 8 1M --modes in-place,clone"
$B --json "$OUT/suite-graph-register1.json"; echo "rc=$?"
NCCL_GRAPH_REGISTER=0 $B --json "$OUT/suite-graph-register0.json"; echo "NCCL_GRAPH_REGISTER=0 rc=$?"
echo "total $((SECONDS - START)) s"
