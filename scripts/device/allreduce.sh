#!/usr/bin/env bash
# The 2-GPU allreduce table of docs/allreduce.md: per size and mode, nccl-tests' all_reduce_perf (eager, and
# CUDA-graph with -G), the minimal torch.distributed loop (minimal_allreduce.py) and the suite
# (`b70bench allreduce --world-size 2`, eager and --graph), RUNS times each (default 3), interleaved; then the
# suite's graph rows at 8 B and 1 MiB again with NCCL_GRAPH_REGISTER=0 (graph-mode in-place against clone).
# Needs 2 CUDA GPUs, nvcc and nccl-tests' source (https://github.com/NVIDIA/nccl-tests), given as the argument
# or as NCCL_TESTS_DIR; run from anywhere:
#   bash scripts/device/allreduce.sh /path/to/nccl-tests
# Writes every raw output, allreduce.log and allreduce-table.md (allreduce_report.py's table) to OUT (default
# results/allreduce in this repository). PYTHON: the interpreter with b70bench and CUDA torch (python3).
set -uo pipefail
NT=${1:-${NCCL_TESTS_DIR:-}}
if [[ -z $NT || ! -f $NT/src/common.h ]]; then
  echo "usage: bash scripts/device/allreduce.sh NCCL_TESTS_DIR (or NCCL_TESTS_DIR=...): nccl-tests' source tree," >&2
  echo "       e.g. git clone https://github.com/NVIDIA/nccl-tests${NT:+ ($NT has no src/common.h)}" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/results/allreduce}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
[[ ${PYTHON:-} == */* ]] && PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")  # before the cd
cd "$ROOT" || exit 1
PY=${PYTHON:-python3}; RUNS=${RUNS:-3}
# NVLink SHARP and multicast off, as for the tables in docs/allreduce.md.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
START=$SECONDS
exec > >(tee "$OUT/allreduce.log") 2>&1

echo "== machine $(date -u +%FT%TZ), commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m
"$PY" -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(),
                             "nccl", torch.cuda.nccl.version())'
"$PY" -c 'from cupy.cuda import nccl; print("cupy nccl", nccl.get_version())' || echo "cupy nccl: not importable"

echo "== build nccl-tests"
PERF=$(PYTHON=$PY bash scripts/device/build_nccl_tests.sh "$NT" | tail -1)
[[ -x $PERF ]] || { echo "the nccl-tests build failed"; exit 1; }
export LD_LIBRARY_PATH="${NCCL_HOME:-$(dirname "$PERF")/nccl}/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cp "$NT/src/common.h" "$OUT/nccl-tests-common.h"

echo "== nccl-tests all_reduce_perf"
timeout 90 "$PERF" -b 8 -e 256M -f 2 -g 2 -d half -n 100 -w 5 | tee "$OUT/nccl-tests.txt"
timeout 90 "$PERF" -b 8 -e 256M -f 2 -g 2 -d half -n 20 -w 5 -G 100 | tee "$OUT/nccl-tests-graph.txt"

echo "== minimal loop and suite, $RUNS x each, eager and graph interleaved"
TR="timeout 150 $PY -m torch.distributed.run --standalone --nproc-per-node 2"
B="timeout 170 $PY -m b70bench allreduce --world-size 2 --timeout 150"
for i in $(seq 1 "$RUNS"); do
  for how in eager graph; do
    flag=""; [[ $how == graph ]] && flag="--graph"
    $TR scripts/device/minimal_allreduce.py $flag > "$OUT/minimal-$how-$i.json"
    echo "minimal $how $i rc=$? after $((SECONDS - START)) s"
    $B $flag --json "$OUT/suite-$how-$i.json"; rc=$?; echo "suite $how $i rc=$rc after $((SECONDS - START)) s"
    if [[ $rc -ne 0 && $how == graph ]]; then  # a mode that cannot be captured must not cost the other rows
      $B $flag --modes in-place,clone,empty-copy --json "$OUT/suite-$how-$i.json"; echo "retry rc=$?"
    fi
  done
done

echo "== graph in-place vs clone at 8 B and 1 MiB, NCCL_GRAPH_REGISTER default and 0"
G="$B --graph --sizes 8 1M --modes in-place,clone"
$G --json "$OUT/suite-graph-register1.json"; echo "rc=$?"
NCCL_GRAPH_REGISTER=0 $G --json "$OUT/suite-graph-register0.json"; echo "NCCL_GRAPH_REGISTER=0 rc=$?"

"$PY" scripts/device/allreduce_report.py "$OUT" > "$OUT/allreduce-table.md"; cat "$OUT/allreduce-table.md"
echo "total $((SECONDS - START)) s; everything in $OUT"
