#!/usr/bin/env bash
# Issue 3 evidence on the device tool (kind nvidia-h200-x2), in one call: nccl-tests built from
# public source, a minimal torch.distributed loop, and the suite (eager and graph, 3 times each).
# Before the call, export nccl-tests' tree into the git-ignored .device/ (never commit it):
#   mkdir -p .device/nccl-tests && git --git-dir=/work/.mirror/NVIDIA+nccl-tests/repo archive HEAD | tar -x -C .device/nccl-tests
# Then: run(command="bash scripts/device/allreduce.sh", carry=[".device"], kind="nvidia-h200-x2")
# Writes $OUT/allreduce.log (everything) and $OUT/allreduce-h200x2.tar.gz (raw outputs + JSON).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/b70bench-out}; mkdir -p "$OUT"
W=/tmp/allreduce-h200x2; rm -rf "$W"; mkdir -p "$W"
ROOT=$PWD; START=$SECONDS
left() { echo $(( ${DEADLINE:-500} - (SECONDS - START) )); }
exec > >(tee "$OUT/allreduce.log") 2>&1

echo "== machine $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m
python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'
python3 -c 'from cupy.cuda import nccl; print("cupy nccl", nccl.get_version())' || echo "cupy nccl: not importable"
NCCL_PKG=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')
echo "nccl package: $NCCL_PKG"; ls "$NCCL_PKG" "$NCCL_PKG/lib"
# The pip package ships libnccl.so.2 only; the linker's -lnccl wants libnccl.so.
mkdir -p "$W/nccl/lib"; ln -s "$NCCL_PKG/include" "$W/nccl/include"
for f in "$NCCL_PKG"/lib/libnccl.so*; do ln -s "$f" "$W/nccl/lib/"; done
[ -e "$W/nccl/lib/libnccl.so" ] || ln -s "$NCCL_PKG/lib/libnccl.so.2" "$W/nccl/lib/libnccl.so"
export LD_LIBRARY_PATH="$W/nccl/lib:${LD_LIBRARY_PATH:-}"
CUDA_HOME=/usr/local/cuda; [ -x $CUDA_HOME/bin/nvcc ] || CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
echo "CUDA_HOME=$CUDA_HOME ($($CUDA_HOME/bin/nvcc --version | tail -1))"

echo "== build nccl-tests $(grep -o 'NCCL_TESTS_VERSION.*' .device/nccl-tests/src/common.h | head -1)"
NT=$ROOT/.device/nccl-tests
( cd "$NT" && timeout 300 make -j16 -C src MPI=0 NCCL_HOME="$W/nccl" CUDA_HOME="$CUDA_HOME" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$NT/build" "$NT/build/all_reduce_perf" )
echo "build rc=$? after $((SECONDS - START)) s"; ls -la "$NT/build/all_reduce_perf"

echo "== nccl-tests all_reduce_perf"
timeout 90 "$NT/build/all_reduce_perf" -b 8 -e 256M -f 2 -g 2 -d half -n 100 -w 5 | tee "$W/nccl-tests.txt"
timeout 90 "$NT/build/all_reduce_perf" -b 8 -e 256M -f 2 -g 2 -d half -n 20 -w 5 -G 100 | tee "$W/nccl-tests-graph.txt"

echo "== minimal torch.distributed loop"
TR="timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2"
$TR scripts/device/minimal_allreduce.py > "$W/minimal-eager.json"; echo "rc=$?"; cat "$W/minimal-eager.json"
$TR scripts/device/minimal_allreduce.py --graph > "$W/minimal-graph.json"; echo "rc=$?"; cat "$W/minimal-graph.json"

echo "== suite (3 x eager, 3 x graph, interleaved)"
B="env PYTHONPATH=. python3 -m b70bench allreduce --world-size 2 --timeout 150"
for i in 1 2 3; do
  for how in eager graph; do
    if [ "$(left)" -lt 60 ]; then echo "skipping suite $how $i: $(left) s left"; continue; fi
    flag=""; [ $how = graph ] && flag="--graph"
    timeout 170 $B $flag --json "$W/suite-$how-$i.json"; rc=$?; echo "suite $how $i rc=$rc after $((SECONDS - START)) s"
    if [ $rc -ne 0 ] && [ $how = graph ]; then  # a mode that cannot be captured must not cost the rest
      timeout 170 $B $flag --modes in-place,clone,empty-copy --json "$W/suite-$how-$i.json"; echo "retry rc=$?"
    fi
  done
done
echo "== fault: a hung rank under the graph path must fail within the timeout, naming it"
if [ "$(left)" -gt 45 ]; then
  ( time B70BENCH_FAULT=rank1:hang timeout 60 $B --graph --sizes 8 --modes in-place --timeout 20 ) ; echo "rc=$?"
fi
ps -eo pid,args | grep "b70bench.allreduce" | grep -v grep || echo "no rank processes left"

cp .device/nccl-tests/src/common.h "$W/" 2>/dev/null; git rev-parse HEAD > "$W/commit.txt" 2>/dev/null
tar -czf "$OUT/allreduce-h200x2.tar.gz" --exclude=nccl -C /tmp allreduce-h200x2
python3 scripts/device/allreduce_report.py "$W" > "$OUT/allreduce-table.md"; cat "$OUT/allreduce-table.md"
echo "total $((SECONDS - START)) s"
