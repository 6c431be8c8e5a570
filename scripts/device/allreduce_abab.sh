#!/usr/bin/env bash
# Whether the suite adds time of its own to an allreduce: the minimal torch.distributed loop (A) and the suite's
# timed row (B) in ONE process group on 2 GPUs, alternating AB/BA per round, eager then CUDA graph
# (allreduce_abab.py says why and how); the table "the suite's row against the minimal loop" in docs/allreduce.md.
#   bash scripts/device/allreduce_abab.sh [/path/to/nccl-tests]
# With nccl-tests' source (the argument or NCCL_TESTS_DIR; built by build_nccl_tests.sh), its eager and -G sweeps
# run first and the table gets their columns (~60 s, taken from the rounds). Total wall time <= TOTAL_S (230)
# + 10 s; ABAB_ARGS: more arguments for allreduce_abab.py. Writes allreduce-abab.{log,json,md} (and
# nccl-tests*.txt) to OUT (default results/allreduce-abab in this repository). PYTHON: the interpreter (python3).
# On the CPU (gloo, no graph), to try it anywhere, from the repository root:
#   ABAB_ARGS="--cpu --sizes 8,6144 --rounds 3" TOTAL_S=120 PYTHON=.venv/bin/python \
#     bash scripts/device/allreduce_abab.sh
set -uo pipefail
NT=${1:-${NCCL_TESTS_DIR:-}}
if [[ -n $NT && ! -f $NT/src/common.h ]]; then
  echo "$NT: not an nccl-tests source tree (no src/common.h); give none to leave nccl-tests out" >&2; exit 2
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/results/allreduce-abab}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
[[ ${PYTHON:-} == */* ]] && PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")  # before the cd
PY=${PYTHON:-python3}
cd "$ROOT" || exit 1
# NVLink SHARP and multicast off, as for the tables in docs/allreduce.md.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export B70BENCH_COMMIT=${B70BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
TOTAL=${TOTAL_S:-230}; START=$SECONDS
left() { echo $(( TOTAL - (SECONDS - START) )); }
exec > >(tee "$OUT/allreduce-abab.log") 2>&1

echo "== machine $(date -u +%FT%TZ), commit $B70BENCH_COMMIT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 30 "$PY" -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(),
                                        "nccl", torch.cuda.is_available() and torch.cuda.nccl.version())'

NT_ARG=()
if [[ -n $NT ]]; then
  echo "== nccl-tests (build, then eager and -G sweeps)"
  PERF=$(PYTHON=$PY timeout 120 bash scripts/device/build_nccl_tests.sh "$NT" 2> "$OUT/nccl-tests-build.log" | tail -1)
  echo "build after $((SECONDS - START)) s: ${PERF:-failed}"; tail -3 "$OUT/nccl-tests-build.log"
  if [[ -x $PERF ]]; then
    export LD_LIBRARY_PATH="${NCCL_HOME:-$(dirname "$PERF")/nccl}/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    timeout 30 "$PERF" -b 8 -e 256M -f 2 -g 2 -d half -n 100 -w 5 > "$OUT/nccl-tests.txt"; echo "rc=$?"
    timeout 30 "$PERF" -b 8 -e 256M -f 2 -g 2 -d half -n 20 -w 5 -G 100 > "$OUT/nccl-tests-graph.txt"
    echo "rc=$?"; NT_ARG=(--nccl-tests "$OUT")
  fi
fi

# Rounds get what is left, 3:2 eager:graph, less ~45 s for torchrun, NCCL init and the last round's overrun.
ROUNDS_S=$(( $(left) - 45 )); [[ $ROUNDS_S -ge 20 ]] || ROUNDS_S=20
EAGER_S=$(( ROUNDS_S * 3 / 5 )); GRAPH_S=$(( ROUNDS_S - EAGER_S ))
echo "== A/B rounds: eager ${EAGER_S} s, graph ${GRAPH_S} s (at $((SECONDS - START)) s)"
T=$(( $(left) - 5 )); [[ $T -ge 65 ]] || T=65
# shellcheck disable=SC2086
timeout -k 5 "$T" "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
  scripts/device/allreduce_abab.py --eager-s "$EAGER_S" --graph-s "$GRAPH_S" --timeout 60 \
  --json "$OUT/allreduce-abab.json" ${ABAB_ARGS:-}
echo "torchrun rc=$? after $((SECONDS - START)) s"
pgrep -af "allreduce_abab.py" || echo "no rank processes left"

echo "== table (A = minimal loop, B = suite's Rank.row, same process group, alternating order)"
timeout 20 "$PY" scripts/device/allreduce_abab.py --report "$OUT/allreduce-abab.json" "${NT_ARG[@]}" \
  | tee "$OUT/allreduce-abab.md"
echo "total $((SECONDS - START)) s; everything in $OUT"
