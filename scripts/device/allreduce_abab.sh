#!/usr/bin/env bash
# Issue 3, "the suite adds nothing of its own": the minimal loop (A) and the suite's timed row (B)
# in ONE process group, alternating AB/BA per round (scripts/device/allreduce_abab.py says why).
#   run(command="B70BENCH_COMMIT=<sha> bash scripts/device/allreduce_abab.sh", kind="nvidia-h200-x2")
# Optional, same call: nccl-tests eager and -G beside it, if its tree was exported into the git-ignored
# .device/ (see allreduce.sh) and carried: carry=[".device"]. It costs ~60 s, taken from the rounds.
# Here, on the CPU: NCCL_TESTS=0 ABAB_ARGS="--cpu --sizes 8,6144 --rounds 3" TOTAL_S=120 PATH=.venv/bin:$PATH bash ...
# Total wall time <= TOTAL_S (230) + 10 s. Writes $OUT/allreduce-abab.{log,json,md}.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export B70BENCH_COMMIT=${B70BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
OUT=${OUT:-/tmp/b70bench-out}; mkdir -p "$OUT"
TOTAL=${TOTAL_S:-230}; START=$SECONDS
left() { echo $(( TOTAL - (SECONDS - START) )); }
exec > >(tee "$OUT/allreduce-abab.log") 2>&1

echo "== machine $(date -u +%FT%TZ), commit $B70BENCH_COMMIT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 30 python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'

NT_ARG=()
NT=$PWD/.device/nccl-tests
if [ "${NCCL_TESTS:-1}" = 1 ] && [ -f "$NT/src/common.h" ]; then
  echo "== nccl-tests (build, then eager and -G sweeps)"
  W=/tmp/abab-nccl; rm -rf "$W"; mkdir -p "$W/nccl/lib"
  NCCL_PKG=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')
  ln -s "$NCCL_PKG/include" "$W/nccl/include"
  for f in "$NCCL_PKG"/lib/libnccl.so*; do ln -s "$f" "$W/nccl/lib/"; done
  [ -e "$W/nccl/lib/libnccl.so" ] || ln -s "$NCCL_PKG/lib/libnccl.so.2" "$W/nccl/lib/libnccl.so"
  export LD_LIBRARY_PATH="$W/nccl/lib:${LD_LIBRARY_PATH:-}"
  CUDA_HOME=/usr/local/cuda; [ -x $CUDA_HOME/bin/nvcc ] || CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
  ( cd "$NT" && timeout 90 make -j16 -C src MPI=0 NCCL_HOME="$W/nccl" CUDA_HOME="$CUDA_HOME" \
      NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$NT/build" "$NT/build/all_reduce_perf" ) > "$W/build.log" 2>&1
  echo "build rc=$? after $((SECONDS - START)) s"; tail -3 "$W/build.log"
  if [ -x "$NT/build/all_reduce_perf" ]; then
    timeout 30 "$NT/build/all_reduce_perf" -b 8 -e 256M -f 2 -g 2 -d half -n 100 -w 5 > "$OUT/nccl-tests.txt"; echo "rc=$?"
    timeout 30 "$NT/build/all_reduce_perf" -b 8 -e 256M -f 2 -g 2 -d half -n 20 -w 5 -G 100 > "$OUT/nccl-tests-graph.txt"
    echo "rc=$?"; NT_ARG=(--nccl-tests "$OUT")
  fi
fi

# Rounds get what is left, 3:2 eager:graph, less ~45 s for torchrun, NCCL init and the last round's overrun.
ROUNDS_S=$(( $(left) - 45 )); [ "$ROUNDS_S" -ge 20 ] || ROUNDS_S=20; EAGER_S=$(( ROUNDS_S * 3 / 5 )); GRAPH_S=$(( ROUNDS_S - EAGER_S ))
echo "== A/B rounds: eager ${EAGER_S} s, graph ${GRAPH_S} s (at $((SECONDS - START)) s)"
T=$(( $(left) - 5 )); [ "$T" -ge 65 ] || T=65
timeout -k 5 "$T" python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
  scripts/device/allreduce_abab.py --eager-s "$EAGER_S" --graph-s "$GRAPH_S" --timeout 60 --json "$OUT/allreduce-abab.json" ${ABAB_ARGS:-}
echo "torchrun rc=$? after $((SECONDS - START)) s"
ps -eo pid,args | grep "allreduce_abab.py" | grep -v grep || echo "no rank processes left"

echo "== table (A = minimal loop, B = suite's Rank.row, same process group, alternating order)"
timeout 20 python3 scripts/device/allreduce_abab.py --report "$OUT/allreduce-abab.json" "${NT_ARG[@]}" \
  | tee "$OUT/allreduce-abab.md"
echo "total $((SECONDS - START)) s"
